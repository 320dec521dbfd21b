#include "common/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace summa {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

bool Exists(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::fclose(f);
  return true;
}

// Reads exactly `n` bytes; returns how many it got.
int64_t ReadFully(gzFile file, uint8_t* out, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 30));
    const int r = gzread(file, out + got, chunk);
    if (r <= 0) break;
    got += r;
  }
  return got;
}

absl::StatusOr<std::string> FindFile(const std::string& dir, const std::string& base) {
  for (const std::string& path : {absl::StrCat(dir, "/", base, ".gz"), absl::StrCat(dir, "/", base)}) {
    if (Exists(path)) return path;
  }
  return absl::NotFoundError(absl::StrCat("dataset file ", dir, "/", base,
                                          "[.gz] not found (install the Debian package "
                                          "dataset-fashion-mnist or pass --data_dir)"));
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims) {
  if (!Exists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  uint8_t magic[4];
  if (ReadFully(file.get(), magic, 4) != 4) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: shorter than the 4-byte IDX magic"));
  }
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not an unsigned-byte IDX file (magic bytes ", magic[0], " ", magic[1],
                     " ", magic[2], " ", magic[3], ", expected 0 0 8 ", expected_dims, ")"));
  }
  if (magic[3] != expected_dims) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": has ", magic[3],
                                                   " dimensions, expected ", expected_dims));
  }
  constexpr int64_t kMaxBytes = int64_t{1} << 34;
  IdxArray array;
  int64_t total = 1;
  for (int i = 0; i < expected_dims; ++i) {
    uint8_t b[4];
    if (ReadFully(file.get(), b, 4) != 4) {
      return absl::DataLossError(absl::StrCat(path, ": truncated inside its header"));
    }
    const int64_t d = (int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    if (d <= 0 || d > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": dimension ", i, " is ", d));
    }
    array.dims.push_back(d);
    if (total > kMaxBytes / d) {  // checked before multiplying: three dimensions overflow int64
      return absl::InvalidArgumentError(absl::StrCat(path, ": header claims more than ", kMaxBytes,
                                                     " bytes (dimensions ", absl::StrJoin(array.dims, " x "), ")"));
    }
    total *= d;
  }
  // The header's size is only a claim: the array grows as the bytes arrive, so a short file is
  // refused without first allocating what its header promised.
  constexpr int64_t kChunk = 1 << 20;
  int64_t got = 0;
  while (got < total) {
    const int64_t want = std::min(kChunk, total - got);
    array.data.resize(got + want);
    const int64_t n = ReadFully(file.get(), array.data.data() + got, want);
    got += n;
    if (n < want) break;
  }
  if (got != total) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header promises ", total,
                                            " data bytes, file has ", got));
  }
  uint8_t extra;
  if (ReadFully(file.get(), &extra, 1) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": has bytes past the ", total,
                                            " its header promises"));
  }
  int zerr = Z_OK;
  gzerror(file.get(), &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream"));
  }
  return array;
}

absl::StatusOr<Dataset> LoadDataset(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "t10k") {
    return absl::InvalidArgumentError(absl::StrCat("unknown split '", split, "' (train or t10k)"));
  }
  SUMMA_ASSIGN_OR_RETURN(std::string images_path,
                         FindFile(dir, absl::StrCat(split, "-images-idx3-ubyte")));
  SUMMA_ASSIGN_OR_RETURN(std::string labels_path,
                         FindFile(dir, absl::StrCat(split, "-labels-idx1-ubyte")));
  SUMMA_ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path, 3));
  SUMMA_ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path, 1));
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " holds ", images.dims[0],
                                                   " images but ", labels_path, " holds ",
                                                   labels.dims[0], " labels"));
  }
  Dataset set;
  set.count = images.dims[0];
  set.rows = static_cast<int>(images.dims[1]);
  set.cols = static_cast<int>(images.dims[2]);
  set.images.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i) set.images[i] = images.data[i] / 255.0f;
  set.labels.resize(set.count);
  for (int64_t i = 0; i < set.count; ++i) {
    if (labels.data[i] > 9) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", i, " is ",
                                                     labels.data[i], ", outside 0..9"));
    }
    set.labels[i] = labels.data[i];
  }
  return set;
}

}  // namespace summa
