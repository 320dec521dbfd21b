// The IDX reader (common/idx.h): LoadDataset over an images file and a labels file cut from the
// fuzz input (plain, or gzip when the bytes are gzip's: zlib tells them apart as the reader
// does), and ReadIdx on the whole input. The reader takes paths, so the bytes go to files in a
// directory of this process's own.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "common/idx.h"

namespace {

std::string& Dir() {
  static std::string dir;
  return dir;
}

void Write(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "idx_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string pattern = (std::filesystem::temp_directory_path() / "summa-idx-fuzz-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  Dir() = pattern;
  std::atexit([] { std::filesystem::remove_all(Dir()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int dims = in.ConsumeBool() ? 3 : 1;
  const std::string images = in.ConsumeRandomLengthString(size);
  const std::string labels = in.ConsumeRemainingBytesAsString();
  Write(Dir() + "/train-images-idx3-ubyte", images);
  Write(Dir() + "/train-labels-idx1-ubyte", labels);

  absl::StatusOr<summa::IdxArray> array = summa::ReadIdx(Dir() + "/train-images-idx3-ubyte", dims);
  if (array.ok()) {
    int64_t total = 1;
    for (int64_t d : array->dims) total *= d;
    Check(static_cast<int>(array->dims.size()) == dims, "an array has other dimensions than asked");
    Check(static_cast<int64_t>(array->data.size()) == total, "an array's data is not its dimensions' product");
  }
  absl::StatusOr<summa::Dataset> set = summa::LoadDataset(Dir(), "train");
  if (set.ok()) {
    Check(static_cast<int64_t>(set->labels.size()) == set->count, "a set has a label count unlike its images'");
    Check(static_cast<int64_t>(set->images.size()) == set->count * set->rows * set->cols,
          "a set's pixels are not count x rows x cols");
    for (int32_t label : set->labels) Check(label >= 0 && label <= 9, "a label outside 0..9");
  }
  return 0;
}
