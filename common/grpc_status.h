// The one place where absl::Status and grpc::Status meet: service edges convert here.
#ifndef SUMMA_COMMON_GRPC_STATUS_H_
#define SUMMA_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace summa {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace summa

#endif  // SUMMA_COMMON_GRPC_STATUS_H_
