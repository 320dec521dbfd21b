// Who may call what: every method of summa.v1.ParameterServer with the role its caller's token
// must hold (common/rpc/transport.h's TokenCheck decides whether a token holds a role). The one
// table of it: the gRPC handlers and the data path (on gRPC and on the socket plane) authorize
// through ParameterServerService::Authorize, which reads it, and security_test walks the service's
// descriptor to show that every method is in it and refused without the right token.
#ifndef SUMMA_SERVER_RPC_METHOD_ROLES_H_
#define SUMMA_SERVER_RPC_METHOD_ROLES_H_

#include <string_view>

#include "common/rpc/transport.h"

namespace summa::server {

struct MethodRole {
  std::string_view method;  // its name in the service: "Join"
  Role role;
};

inline constexpr MethodRole kMethodRoles[] = {
    // The members' calls.
    {"Join", Role::kWorker},
    {"Heartbeat", Role::kWorker},
    {"Leave", Role::kWorker},
    {"RollBack", Role::kWorker},
    {"DataPlane", Role::kWorker},
    {"Initialize", Role::kWorker},
    {"Push", Role::kWorker},
    {"Pull", Role::kWorker},
    {"PushPull", Role::kWorker},
    {"AllReduce", Role::kWorker},
    // Shard coordination: the other shards call shard 0 with the workers' token.
    {"Follow", Role::kWorker},
    // Status: open unless --status_needs_token.
    {"GetStatus", Role::kStatus},
    // Operators' calls.
    {"Checkpoint", Role::kAdmin},
    {"Export", Role::kAdmin},
};

// The role `method` requires; the admin's for a name not in the table, so that a method added
// to the service and forgotten here is closed, not open.
constexpr Role RequiredRole(std::string_view method) {
  for (const MethodRole& m : kMethodRoles) {
    if (m.method == method) return m.role;
  }
  return Role::kAdmin;
}

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_METHOD_ROLES_H_
