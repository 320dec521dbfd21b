// The one home of TensorSpec <-> summa.v1.Tensor conversion, for the server's edge, its
// checkpoints and the worker's client. Free functions; thread-safe.
#ifndef SUMMA_COMMON_RPC_TENSOR_PROTO_H_
#define SUMMA_COMMON_RPC_TENSOR_PROTO_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/compression.h"
#include "common/tensor.h"
#include "summa/v1/summa.pb.h"

namespace summa {

// INVALID_ARGUMENT for a dtype other than float32 or a bad shape, naming the tensor.
absl::StatusOr<TensorSpec> SpecFromProto(const summa::v1::Tensor& tensor);

// Sets name, dtype and shape; leaves `out`'s data alone.
void SpecToProto(const TensorSpec& spec, summa::v1::Tensor* out);

// A push's or pull's dtype; nullopt for one the wire does not carry. `unspecified_is_float32`
// reads DTYPE_UNSPECIFIED (a field left unset) as float32.
std::optional<WireDType> WireDTypeFromProto(summa::v1::DType dtype, bool unspecified_is_float32);
summa::v1::DType WireDTypeToProto(WireDType dtype);
// The enum's name ("DTYPE_BFLOAT16"), or its number for a value this build does not know.
std::string DTypeName(summa::v1::DType dtype);

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_TENSOR_PROTO_H_
