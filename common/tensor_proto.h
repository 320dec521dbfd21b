// The one home of TensorSpec <-> summa.v1.Tensor conversion, for the server's edge, its
// checkpoints and the worker's client. Free functions; thread-safe.
#ifndef SUMMA_COMMON_TENSOR_PROTO_H_
#define SUMMA_COMMON_TENSOR_PROTO_H_

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "summa/v1/summa.pb.h"

namespace summa {

// INVALID_ARGUMENT for a dtype other than float32 or a bad shape, naming the tensor.
absl::StatusOr<TensorSpec> SpecFromProto(const summa::v1::Tensor& tensor);

// Sets name, dtype and shape; leaves `out`'s data alone.
void SpecToProto(const TensorSpec& spec, summa::v1::Tensor* out);

}  // namespace summa

#endif  // SUMMA_COMMON_TENSOR_PROTO_H_
