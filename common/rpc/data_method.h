// The data path's methods of summa.v1.ParameterServer, the one home of their names, gRPC paths,
// socket-plane numbers (the roles they require are server/rpc/method_roles.h's): the gRPC data path (server/rpc/data_path.h), the socket
// plane (server/rpc/socket_plane.h) and the client (client/) all take them from here.
#ifndef SUMMA_COMMON_RPC_DATA_METHOD_H_
#define SUMMA_COMMON_RPC_DATA_METHOD_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace summa {

// The numbers are the socket plane's (common/rpc/socket_frame.h): part of its wire format.
enum class DataMethod : uint32_t {
  kInitialize = 1,
  kPush = 2,
  kPull = 3,
  kPushPull = 4,
  kAllReduce = 5,
  kSparsePull = 6,
  kSparsePush = 7,
};
inline constexpr DataMethod kDataMethods[] = {DataMethod::kInitialize, DataMethod::kPush,       DataMethod::kPull,
                                              DataMethod::kPushPull,   DataMethod::kAllReduce,  DataMethod::kSparsePull,
                                              DataMethod::kSparsePush};

// "Push"; the method's name in the service.
absl::string_view DataMethodName(DataMethod method);
// "/summa.v1.ParameterServer/Push": the gRPC path (a NUL-terminated string that lives forever).
const char* DataMethodPath(DataMethod method);
// The method of a socket frame's number, or of a gRPC path; nullopt for any other.
std::optional<DataMethod> DataMethodOfNumber(uint32_t number);
std::optional<DataMethod> DataMethodOf(absl::string_view grpc_path);

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_DATA_METHOD_H_
