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

std::optional<WireDType> WireDTypeFromProto(summa::v1::DType dtype, bool unspecified_is_float32) {
  switch (dtype) {
    case summa::v1::DTYPE_UNSPECIFIED:
      if (unspecified_is_float32) return WireDType::kFloat32;
      return std::nullopt;
    case summa::v1::DTYPE_FLOAT32: return WireDType::kFloat32;
    case summa::v1::DTYPE_BFLOAT16: return WireDType::kBfloat16;
    case summa::v1::DTYPE_FLOAT16: return WireDType::kFloat16;
    default: return std::nullopt;
  }
}

std::string DTypeName(summa::v1::DType dtype) {
  std::string name = summa::v1::DType_Name(dtype);
  return name.empty() ? absl::StrCat(static_cast<int>(dtype)) : name;
}

summa::v1::DType WireDTypeToProto(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFloat32: return summa::v1::DTYPE_FLOAT32;
    case WireDType::kBfloat16: return summa::v1::DTYPE_BFLOAT16;
    case WireDType::kFloat16: return summa::v1::DTYPE_FLOAT16;
  }
  return summa::v1::DTYPE_UNSPECIFIED;
}

}  // namespace summa
