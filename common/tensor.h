// Tensor descriptions shared by server and worker: name, dtype and shape, and the raw
// little-endian byte layout used on the wire. Only float32 exists today.
#ifndef SUMMA_COMMON_TENSOR_H_
#define SUMMA_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace summa {

enum class DType { kFloat32 };

struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;

  // prod(shape); 1 for a scalar.
  int64_t num_elements() const;
  int64_t num_bytes() const { return num_elements() * 4; }
  bool operator==(const TensorSpec& other) const {
    return name == other.name && dtype == other.dtype && shape == other.shape;
  }
};

// "[20, 1, 3, 3]".
std::string ShapeString(absl::Span<const int64_t> shape);

// Checks that a shape has only positive dimensions and fits in memory.
absl::Status ValidateShape(absl::Span<const int64_t> shape);

// The wire holds raw little-endian float32; every platform Summa builds on is little-endian, so
// a byte string and a float array share one layout and copies are plain memcpy.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Summa's wire format assumes little-endian");

}  // namespace summa

#endif  // SUMMA_COMMON_TENSOR_H_
