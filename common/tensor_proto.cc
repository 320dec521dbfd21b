#include "common/tensor_proto.h"

#include "absl/strings/str_cat.h"

namespace summa {

absl::StatusOr<TensorSpec> SpecFromProto(const summa::v1::Tensor& t) {
  if (t.dtype() != summa::v1::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dtype ",
                                                   summa::v1::DType_Name(t.dtype()),
                                                   "; only DTYPE_FLOAT32 is supported"));
  }
  TensorSpec spec;
  spec.name = t.name();
  spec.shape.assign(t.shape().begin(), t.shape().end());
  absl::Status shape = ValidateShape(spec.shape);
  if (!shape.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "': ", shape.message()));
  }
  return spec;
}

void SpecToProto(const TensorSpec& spec, summa::v1::Tensor* out) {
  out->set_name(spec.name);
  out->set_dtype(summa::v1::DTYPE_FLOAT32);
  out->clear_shape();
  for (int64_t d : spec.shape) out->add_shape(d);
}

}  // namespace summa
