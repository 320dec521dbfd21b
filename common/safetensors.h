// Hugging Face's safetensors format, written and read: 8 bytes of little-endian u64 N, N bytes of
// a UTF-8 JSON header (an object: each tensor's name to {"dtype", "shape", "data_offsets":
// [BEGIN, END)} relative to the data section, and an optional "__metadata__" of strings to
// strings), padded with spaces so that the data section starts at a multiple of 8, then the
// tensors' little-endian row-major values, which cover the data section exactly (no holes, no
// overlaps). Summa writes float32 (F32) only; it reads F32, and F16, BF16 and F64 widened or
// narrowed to float32 (F64 rounds to nearest). Files are written through common/atomic_file.h:
// a crash leaves the old file or the new one, never a torn one. No gRPC. The classes are not
// thread-safe.
#ifndef SUMMA_COMMON_SAFETENSORS_H_
#define SUMMA_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/atomic_file.h"
#include "common/tensor.h"

namespace summa {

// `__metadata__`, in the order written (a reader's: sorted by key).
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// A header's larger sizes are refused before anything is allocated for them (as the reference
// implementation does).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16" or "F64"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // bytes, in the data section
  uint64_t end = 0;    // exclusive
  int64_t num_elements() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // by data offset: the file's order
  SafetensorsMetadata metadata;           // sorted by key
  uint64_t data_start = 0;                // 8 + N: where the data section starts in the file
  uint64_t data_bytes = 0;
  // The tensors as float32 specs, in the file's order.
  std::vector<TensorSpec> Specs() const;
};

// Parses and checks the JSON header `json` (the N bytes after the length) of a file whose data
// section holds `data_bytes`. INVALID_ARGUMENT naming the fault: not a JSON object (it must begin
// with '{'), JSON that does not parse or is not UTF-8, a duplicate name (or key), an entry without
// dtype, shape or data_offsets or with other fields, an unknown dtype, a negative or non-integer
// dimension or offset, offsets unlike the shape's bytes, overlapping offsets, a hole between
// tensors, a metadata value that is not a string; DATA_LOSS when the tensors end past the data
// section (a file cut short) and INVALID_ARGUMENT when bytes follow the last one.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t data_bytes);

// The header for float32 tensors `specs` laid end to end in order: the 8-byte length and the JSON,
// padded with spaces to a multiple of 8. INVALID_ARGUMENT for an empty or duplicate name, or the
// name "__metadata__".
absl::StatusOr<std::string> EncodeSafetensorsHeader(absl::Span<const TensorSpec> specs,
                                                    const SafetensorsMetadata& metadata);

// Writes a float32 safetensors file a piece at a time: the header at Create, then the tensors'
// values in order through any number of Appends (a model's partitions, say), then Finish. The
// file appears (atomically) only on Finish; a writer destroyed before removes its temporary file.
class SafetensorsWriter {
 public:
  // INTERNAL when the file cannot be created; INVALID_ARGUMENT as EncodeSafetensorsHeader.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const std::string& path,
                                                                   absl::Span<const TensorSpec> specs,
                                                                   const SafetensorsMetadata& metadata);
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // FAILED_PRECONDITION when the values would run past the tensors'.
  absl::Status Append(absl::Span<const float> values);
  // FAILED_PRECONDITION unless every value was appended. Returns the file's size in bytes.
  absl::StatusOr<uint64_t> Finish();

 private:
  SafetensorsWriter(std::unique_ptr<AtomicFile> file, uint64_t header_bytes, uint64_t values);
  std::unique_ptr<AtomicFile> file_;
  const uint64_t header_bytes_;
  const uint64_t values_;  // float32 values the tensors hold
  uint64_t written_ = 0;
};

// The whole file at once.
absl::StatusOr<uint64_t> WriteSafetensors(const std::string& path, absl::Span<const TensorSpec> specs,
                                          absl::Span<const float> flat, const SafetensorsMetadata& metadata);

// Reads a safetensors file: the header at Open, the tensors' values on demand.
class SafetensorsReader {
 public:
  // NOT_FOUND when `path` cannot be opened; DATA_LOSS when it is shorter than 8 bytes or than the
  // header its length announces; INVALID_ARGUMENT (or DATA_LOSS) as ParseSafetensorsHeader, each
  // message starting with the path.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // Tensor `i`'s (in header().tensors) values as float32, into `out` (num_elements of them).
  absl::Status ReadFloat32(size_t i, absl::Span<float> out);
  // Every tensor's values end to end in the file's order, as float32.
  absl::StatusOr<std::vector<float>> ReadAllFloat32();

 private:
  SafetensorsReader(std::string path, int fd, SafetensorsHeader header);
  const std::string path_;
  const int fd_;
  const SafetensorsHeader header_;
};

}  // namespace summa

#endif  // SUMMA_COMMON_SAFETENSORS_H_
