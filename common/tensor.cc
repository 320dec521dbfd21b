#include "common/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace summa {

int64_t TensorSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ValidateShape(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a dimension that is not positive"));
    }
    if (n > (int64_t{1} << 40) / d) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    n *= d;
  }
  return absl::OkStatus();
}

}  // namespace summa
