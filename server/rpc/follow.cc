// Shard 0's side of shard coordination: the followers' reports (Follow), held until the
// membership view moves so that a follower hears of an exclusion in one round trip.
#include "server/rpc/service.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "server/rpc/parked_calls.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

// The longest a follower's report is held (ShardReport.wait_ms).
constexpr absl::Duration kMaxFollowWait = absl::Seconds(30);

}  // namespace

grpc::Status ParameterServerService::Follow(grpc::ServerContext* context, const pb::ShardReport* request,
                                            pb::ShardView* response) {
  if (grpc::Status denied = Authorize(*context, "Follow"); !denied.ok()) return denied;
  const ServerOptions& o = core_->options();
  if (o.shards <= 1 || o.shard != 0) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
                             "this server is shard ", o.shard, " of ", o.shards,
                             ", not shard 0 of several: give --coordinator shard 0's address")));
  }
  if (request->shards() != o.shards || request->shard() <= 0 || request->shard() >= o.shards) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
                             "a report from shard ", request->shard(), " of ", request->shards(),
                             " reached shard 0 of ", o.shards, ": start every shard with the same --shards")));
  }
  shards_.Record(*request, context->peer(), absl::Now());
  Membership& members = core_->membership();
  auto answer = [&members, response](bool held) {
    response->set_view(members.view());
    response->set_incarnation(members.incarnation());
    response->clear_excluded_ranks();
    for (int r : members.ExcludedRanks()) response->add_excluded_ranks(r);
    response->set_job_error(members.job_error());
    response->set_held(held);
  };
  if (request->wait_ms() == 0 || request->view() != members.view() ||
      request->incarnation() != members.incarnation() || members.job_ended()) {
    answer(/*held=*/false);
    return grpc::Status::OK;
  }
  // The follower is at this view: hold its report until the view moves (or its wait ends), so
  // that it hears of an exclusion in one round trip rather than at its next report.
  const absl::Duration wait =
      std::clamp(absl::Milliseconds(request->wait_ms()), absl::Milliseconds(10), kMaxFollowWait);
  BlockedCall blocked;
  std::shared_ptr<Parked> held;
  {
    CallsToFinish released;  // finished after the lock is released
    absl::MutexLock lock(&held_mu_);
    // A held report counts against its peer's parked calls; past the limit it is answered at once.
    if (holding_ && held_ < kMaxHeldReports) {
      absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(PeerKey(-1, context->peer()), 1);
      if (parked.ok()) {
        held = std::make_shared<Parked>(&blocked, [answer](uint64_t, const Snapshot&, bool) { answer(/*held=*/true); },
                                        Parked::WaitSpan{}, Parked::Holds{*std::move(parked), {}});
        held_reports_.Park(held, request->view() + 1, absl::InfiniteFuture());
        ++held_;
        // A view that moved after the check above, before the park, is answered here: its observer
        // may have run before the call was parked.
        held_reports_.Release(members.view(), NoSnapshot, released);
      }
    }
  }
  // Held: answered when the view moves, at the end of the wait (by this thread), or when the
  // server stops holding reports (its shutdown).
  if (held != nullptr) {
    const grpc::Status status = blocked.Wait(*context, *held, wait);
    absl::MutexLock lock(&held_mu_);
    --held_;
    return status;
  }
  answer(/*held=*/false);  // shutting down, or too many held: the next report comes after the interval
  return grpc::Status::OK;
}

void ParameterServerService::OnMembershipChange() {
  CallsToFinish released;
  absl::MutexLock lock(&held_mu_);
  held_reports_.Release(core_->membership().view(), NoSnapshot, released);
}

void ParameterServerService::StopHoldingReports() {
  CallsToFinish released;
  absl::MutexLock lock(&held_mu_);
  holding_ = false;
  held_reports_.ReleaseAll(0, NoSnapshot, released);
}

}  // namespace summa::server
