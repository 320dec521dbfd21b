#include "server/rpc/method_roles.h"

#include "absl/strings/str_cat.h"

namespace summa::server {

absl::StatusOr<int> ActingRank(const Caller& caller, std::string_view method, int rank) {
  if (!caller.scoped()) return rank;
  const absl::string_view name(method.data(), method.size());
  switch (MethodRoleOf(method).acts) {
    case Acts::kAsNoRank:
      return rank;
    case Acts::kAsNewRank:
      if (rank == kAnyRank) return caller.rank;
      break;
    case Acts::kAsRank:
      if (rank == kAnyRank) {
        return absl::PermissionDeniedError(absl::StrCat(name, " for rank -1 (no member's: an operator's) acts for "
                                                        "the whole job: this token is rank ", caller.rank,
                                                        "'s (--token_file); use a bare token"));
      }
      break;
    case Acts::kForTheJob:
      return absl::PermissionDeniedError(absl::StrCat(name, " acts for the whole job: this token is rank ", caller.rank,
                                                      "'s (--token_file); use a bare token"));
  }
  if (rank != caller.rank) {
    return absl::PermissionDeniedError(
        absl::StrCat("this token is rank ", caller.rank, "'s (--token_file); it cannot act as rank ", rank));
  }
  return rank;
}

}  // namespace summa::server
