// Who may call what: every method of summa.v1.ParameterServer with the role its caller's token
// must hold (common/rpc/tokens.h's TokenCheck decides whether a token holds a role) and the rank
// it acts as, which a worker token scoped to one rank must match. The one table of it: the gRPC
// handlers and the data path (on gRPC and on the socket plane) authorize through
// ParameterServerService::Authorize and ActingRank, which read it, and security_test walks the
// service's descriptor to show that every method is in it and refused without the right token.
#ifndef SUMMA_SERVER_RPC_METHOD_ROLES_H_
#define SUMMA_SERVER_RPC_METHOD_ROLES_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "common/rpc/tokens.h"

namespace summa::server {

// The rank a method's call acts as, which a rank-scoped token must be scoped to.
enum class Acts {
  kAsNoRank,   // its request names no rank: the role alone decides
  kAsRank,     // as its request's rank; rank -1 (a pull for no member: an operator's) is the whole job's
  kAsNewRank,  // Join: as its request's rank, or -1 for one the server assigns (a scoped token's own)
  kForTheJob,  // for every rank at once: never with a scoped token
};

struct MethodRole {
  std::string_view method;  // its name in the service: "Join"
  Role role;
  Acts acts;
};

inline constexpr MethodRole kMethodRoles[] = {
    // The members' calls.
    {"Join", Role::kWorker, Acts::kAsNewRank},
    {"Heartbeat", Role::kWorker, Acts::kAsRank},
    {"Leave", Role::kWorker, Acts::kAsRank},
    {"RollBack", Role::kWorker, Acts::kAsRank},
    {"DataPlane", Role::kWorker, Acts::kAsNoRank},
    {"Initialize", Role::kWorker, Acts::kAsRank},
    {"Push", Role::kWorker, Acts::kAsRank},
    {"Pull", Role::kWorker, Acts::kAsRank},
    {"PushPull", Role::kWorker, Acts::kAsRank},
    {"SparsePull", Role::kWorker, Acts::kAsRank},
    {"SparsePush", Role::kWorker, Acts::kAsRank},
    // A member collective's rank is the member's; a fixed group's is the caller's place in the
    // group, its own say-so, so a scoped token may take only its own rank's place there too (the
    // default: summa.allreduce numbers a fixed group by the processes' ranks). A group numbered
    // otherwise needs an unscoped token.
    {"AllReduce", Role::kWorker, Acts::kAsRank},
    // Shard coordination: the other shards call shard 0 with the workers' token, an unscoped one.
    {"Follow", Role::kWorker, Acts::kForTheJob},
    // Status: open unless --status_needs_token.
    {"GetStatus", Role::kStatus, Acts::kAsNoRank},
    // Operators' calls.
    {"Checkpoint", Role::kAdmin, Acts::kAsNoRank},
    {"Export", Role::kAdmin, Acts::kAsNoRank},
};

// `method`'s row; the admin's, acting for the whole job, for a name not in the table, so that a
// method added to the service and forgotten here is closed, not open.
constexpr MethodRole MethodRoleOf(std::string_view method) {
  for (const MethodRole& m : kMethodRoles) {
    if (m.method == method) return m;
  }
  return {method, Role::kAdmin, Acts::kForTheJob};
}

// The role `method` requires.
constexpr Role RequiredRole(std::string_view method) { return MethodRoleOf(method).role; }

// The rank a call of `method` whose request names `rank` acts as, for `caller` (TokenCheck::
// Identify): `rank` itself, but for a Join of rank -1 by a scoped token, which acts as the
// token's rank (the server assigns it). PERMISSION_DENIED naming both ranks and the flag when
// the caller's token is scoped to another rank, or naming why when the call acts for the whole
// job (a Follow, a pull for no member) and the token is scoped at all. Refused, the call changes
// nothing: every path calls this before the core sees the request.
absl::StatusOr<int> ActingRank(const Caller& caller, std::string_view method, int rank);

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_METHOD_ROLES_H_
