#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/compression.h"
#include "common/safetensors_json.h"
#include "common/status_macros.h"

namespace summa {
namespace {

constexpr absl::string_view kMetadataKey = "__metadata__";

// A JSON number that is a non-negative integer within u64, written as one ("8", not "8.0").
absl::StatusOr<uint64_t> Unsigned(const Json& v, const std::string& what) {
  const bool digits_only = v.kind == Json::kNumber && !v.text.empty() &&
                           std::all_of(v.text.begin(), v.text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_only) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", v.kind == Json::kNumber ? v.text : KindName(v.kind),
                                                   ", not a non-negative integer"));
  }
  uint64_t n = 0;
  for (char c : v.text) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (n > (UINT64_MAX - d) / 10) return absl::InvalidArgumentError(absl::StrCat(what, " ", v.text, " is past 2^64"));
    n = n * 10 + d;
  }
  return n;
}

int DTypeBytes(absl::string_view dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& v) {
  const std::string where = absl::StrCat("tensor \"", name, "\"");
  if (v.kind != Json::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is ", KindName(v.kind), ", not an object"));
  }
  const Json* dtype = nullptr;
  const Json* shape = nullptr;
  const Json* offsets = nullptr;
  for (const auto& [key, value] : v.members) {
    if (key == "dtype") dtype = &value;
    else if (key == "shape") shape = &value;
    else if (key == "data_offsets") offsets = &value;
    else return absl::InvalidArgumentError(absl::StrCat(where, " has an unknown field \"", key, "\""));
  }
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, " lacks \"", dtype == nullptr ? "dtype" : shape == nullptr ? "shape" : "data_offsets", "\""));
  }
  SafetensorsEntry e;
  e.name = name;
  if (dtype->kind != Json::kString) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dtype is ", KindName(dtype->kind), ", not a string"));
  }
  e.dtype = dtype->text;
  const int elem = DTypeBytes(e.dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has dtype \"", e.dtype,
                                                   "\"; Summa reads F32, F16, BF16 and F64"));
  }
  if (shape->kind != Json::kArray) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shape is ", KindName(shape->kind), ", not an array"));
  }
  // The element count, capped: past 2^62 bytes no file can hold it, and no product overflows.
  constexpr uint64_t kCap = uint64_t{1} << 62;
  uint64_t count = 1;
  for (size_t d = 0; d < shape->items.size(); ++d) {
    SUMMA_ASSIGN_OR_RETURN(const uint64_t dim, Unsigned(shape->items[d], absl::StrCat(where, ": dimension ", d)));
    if (dim > kCap) return absl::InvalidArgumentError(absl::StrCat(where, ": dimension ", d, " is ", dim, ", past 2^62"));
    e.shape.push_back(static_cast<int64_t>(dim));
    count = (count != 0 && dim > kCap / count) ? kCap + 1 : count * dim;
  }
  if (offsets->kind != Json::kArray || offsets->items.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets must be [BEGIN, END]"));
  }
  SUMMA_ASSIGN_OR_RETURN(e.begin, Unsigned(offsets->items[0], absl::StrCat(where, ": data_offsets' BEGIN")));
  SUMMA_ASSIGN_OR_RETURN(e.end, Unsigned(offsets->items[1], absl::StrCat(where, ": data_offsets' END")));
  if (e.end < e.begin) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
  }
  if (count > kCap / elem || count * elem != e.end - e.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", ShapeString(e.shape), " of ", e.dtype, " needs ",
        count > kCap / elem ? "more than 2^62" : absl::StrCat(count * elem), " bytes, but data_offsets [", e.begin, ", ",
        e.end, "] hold ", e.end - e.begin));
  }
  return e;
}

absl::Status CheckName(absl::string_view name, absl::string_view what) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("an empty ", what));
  if (FirstInvalidUtf8(name) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " \"", name, "\" is not UTF-8"));
  }
  return absl::OkStatus();
}

absl::Status ReadAt(int fd, const std::string& path, void* out, uint64_t size, uint64_t offset) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("read ", path, ": ", std::strerror(errno)));
    if (n == 0) return absl::DataLossError(absl::StrCat(path, " ends early (it shrank while read?)"));
    p += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SafetensorsEntry::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> SafetensorsHeader::Specs() const {
  std::vector<TensorSpec> specs;
  for (const SafetensorsEntry& e : tensors) specs.push_back({e.name, DType::kFloat32, e.shape});
  return specs;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t data_bytes) {
  if (json.empty() || json.front() != '{') {
    return absl::InvalidArgumentError("the header does not begin with '{' (it must be a JSON object)");
  }
  if (const size_t bad = FirstInvalidUtf8(json); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the header is not UTF-8 (byte ", bad, ")"));
  }
  size_t end = 0;
  SUMMA_ASSIGN_OR_RETURN(const Json root, ParseJsonValue(json, &end));
  for (size_t i = end; i < json.size(); ++i) {
    if (json[i] != ' ') {
      return absl::InvalidArgumentError(absl::StrCat("byte ", i, " of the header follows its JSON object and is not ",
                                                     "a space (the header may be padded with spaces only)"));
    }
  }
  SafetensorsHeader header;
  header.data_start = 8 + json.size();
  header.data_bytes = data_bytes;
  for (const auto& [key, value] : root.members) {
    if (key == kMetadataKey) {
      if (value.kind != Json::kObject) {
        return absl::InvalidArgumentError(absl::StrCat("__metadata__ is ", KindName(value.kind), ", not an object"));
      }
      for (const auto& [mkey, mvalue] : value.members) {
        if (mvalue.kind != Json::kString) {
          return absl::InvalidArgumentError(absl::StrCat("__metadata__ \"", mkey, "\" is ", KindName(mvalue.kind),
                                                         ", not a string (metadata maps strings to strings)"));
        }
        header.metadata.emplace_back(mkey, mvalue.text);
      }
      continue;
    }
    SUMMA_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(key, value));
    header.tensors.push_back(std::move(entry));
  }
  std::sort(header.metadata.begin(), header.metadata.end());
  std::stable_sort(header.tensors.begin(), header.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The data section, exactly covered: each tensor starts where the one before ended.
  uint64_t covered = 0;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const SafetensorsEntry& e = header.tensors[i];
    if (e.begin < covered) {
      const SafetensorsEntry& before = header.tensors[i - 1];
      return absl::InvalidArgumentError(absl::StrCat("tensors \"", before.name, "\" [", before.begin, ", ", before.end,
                                                     ") and \"", e.name, "\" [", e.begin, ", ", e.end, ") overlap"));
    }
    if (e.begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat("bytes [", covered, ", ", e.begin, ") of the data section, before \"",
                                                     e.name, "\", belong to no tensor (a hole)"));
    }
    covered = e.end;
  }
  if (covered > data_bytes) {
    return absl::DataLossError(absl::StrCat("the tensors need ", covered, " bytes of data but the file holds ",
                                            data_bytes, " after its header (cut short?)"));
  }
  if (covered < data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the last ", data_bytes - covered, " of the data section's ",
                                                   data_bytes, " bytes belong to no tensor"));
  }
  return header;
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(absl::Span<const TensorSpec> specs,
                                                    const SafetensorsMetadata& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    AppendJsonString(kMetadataKey, &json);
    json += ":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      SUMMA_RETURN_IF_ERROR(CheckName(metadata[i].first, "metadata key"));
      if (FirstInvalidUtf8(metadata[i].second) != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("the metadata value of \"", metadata[i].first, "\" is not UTF-8"));
      }
      for (size_t j = 0; j < i; ++j) {
        if (metadata[j].first == metadata[i].first) {
          return absl::InvalidArgumentError(absl::StrCat("the metadata key \"", metadata[i].first, "\" comes twice"));
        }
      }
      if (i > 0) json += ",";
      AppendJsonString(metadata[i].first, &json);
      json += ":";
      AppendJsonString(metadata[i].second, &json);
    }
    json += "}";
  }
  uint64_t offset = 0;
  absl::flat_hash_set<absl::string_view> names;
  for (const TensorSpec& spec : specs) {
    SUMMA_RETURN_IF_ERROR(CheckName(spec.name, "tensor name"));
    if (spec.name == kMetadataKey) return absl::InvalidArgumentError("a tensor may not be named __metadata__");
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("the tensor name \"", spec.name, "\" comes twice"));
    }
    if (json.size() > 1) json += ",";
    AppendJsonString(spec.name, &json);
    const uint64_t bytes = static_cast<uint64_t>(spec.num_bytes());
    absl::StrAppend(&json, ":{\"dtype\":\"F32\",\"shape\":[", absl::StrJoin(spec.shape, ","), "],\"data_offsets\":[",
                    offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  json += "}";
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<AtomicFile> file, uint64_t header_bytes, uint64_t values)
    : file_(std::move(file)), header_bytes_(header_bytes), values_(values) {}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(const std::string& path,
                                                                             absl::Span<const TensorSpec> specs,
                                                                             const SafetensorsMetadata& metadata) {
  SUMMA_ASSIGN_OR_RETURN(const std::string header, EncodeSafetensorsHeader(specs, metadata));
  uint64_t values = 0;
  for (const TensorSpec& spec : specs) values += static_cast<uint64_t>(spec.num_elements());
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path));
  SUMMA_RETURN_IF_ERROR(file->Append(header));
  return std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(std::move(file), header.size(), values));
}

absl::Status SafetensorsWriter::Append(absl::Span<const float> values) {
  if (written_ + values.size() > values_) {
    return absl::FailedPreconditionError(absl::StrCat(file_->path(), ": ", written_ + values.size(),
                                                      " values appended, but the tensors hold ", values_));
  }
  SUMMA_RETURN_IF_ERROR(file_->Append(values.data(), values.size() * sizeof(float)));
  written_ += values.size();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SafetensorsWriter::Finish() {
  if (written_ != values_) {
    return absl::FailedPreconditionError(absl::StrCat(file_->path(), ": ", written_, " of the tensors' ", values_,
                                                      " values appended"));
  }
  SUMMA_RETURN_IF_ERROR(file_->Commit());
  return header_bytes_ + values_ * sizeof(float);
}

absl::StatusOr<uint64_t> WriteSafetensors(const std::string& path, absl::Span<const TensorSpec> specs,
                                          absl::Span<const float> flat, const SafetensorsMetadata& metadata) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer, SafetensorsWriter::Create(path, specs, metadata));
  SUMMA_RETURN_IF_ERROR(writer->Append(flat));
  return writer->Finish();
}

SafetensorsReader::SafetensorsReader(std::string path, int fd, SafetensorsHeader header)
    : path_(std::move(path)), fd_(fd), header_(std::move(header)) {}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  auto fail = [&](const absl::Status& s) {
    ::close(fd);
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(absl::InternalError(std::strerror(errno)));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return fail(absl::DataLossError(absl::StrCat("the file is ", size, " bytes, shorter than the 8-byte header length")));
  }
  unsigned char len[8];
  if (absl::Status s = ReadAt(fd, path, len, 8, 0); !s.ok()) return fail(s);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8) {
    return fail(absl::DataLossError(absl::StrCat("the header length ", n, " runs past the end of the file (",
                                                 size - 8, " bytes follow the length)")));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return fail(absl::InvalidArgumentError(absl::StrCat("the header length ", n, " is past the limit of ",
                                                        kMaxSafetensorsHeaderBytes, " bytes")));
  }
  std::string json(n, '\0');
  if (absl::Status s = ReadAt(fd, path, json.data(), n, 8); !s.ok()) return fail(s);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(json, size - 8 - n);
  if (!header.ok()) return fail(header.status());
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(path, fd, *std::move(header)));
}

absl::Status SafetensorsReader::ReadFloat32(size_t i, absl::Span<float> out) {
  const SafetensorsEntry& e = header_.tensors.at(i);
  const auto count = static_cast<size_t>(e.num_elements());
  if (out.size() != count) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name, "\" holds ", count, " values, not ", out.size()));
  }
  const uint64_t at = header_.data_start + e.begin;
  if (e.dtype == "F32") return ReadAt(fd_, path_, out.data(), e.end - e.begin, at);
  std::vector<char> raw(e.end - e.begin);
  SUMMA_RETURN_IF_ERROR(ReadAt(fd_, path_, raw.data(), raw.size(), at));
  if (e.dtype == "F16") {
    DecodeValues(WireDType::kFloat16, raw.data(), out);
  } else if (e.dtype == "BF16") {
    DecodeValues(WireDType::kBfloat16, raw.data(), out);
  } else {  // F64: rounded to the nearest float32
    for (size_t k = 0; k < count; ++k) {
      double d;
      std::memcpy(&d, raw.data() + 8 * k, 8);
      out[k] = static_cast<float>(d);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> SafetensorsReader::ReadAllFloat32() {
  int64_t total = 0;
  for (const SafetensorsEntry& e : header_.tensors) total += e.num_elements();
  std::vector<float> flat(static_cast<size_t>(total));
  int64_t offset = 0;
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    const int64_t n = header_.tensors[i].num_elements();
    SUMMA_RETURN_IF_ERROR(ReadFloat32(i, absl::MakeSpan(flat).subspan(offset, n)));
    offset += n;
  }
  return flat;
}

}  // namespace summa
