// Coordination of server shards: shard 0 holds the group's membership view (who is in, whether
// the job has ended; server/core/membership.h). Every other shard reports to it (ShardFollower,
// summa-server --coordinator; shard 0 answers when its view moves, or after half a second) and
// follows the view it answers with, so that the shards never disagree on who is in the group;
// shard 0 keeps the reports (ShardBoard) and its GetStatus shows the whole job.
#ifndef SUMMA_SERVER_RPC_COORDINATION_H_
#define SUMMA_SERVER_RPC_COORDINATION_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/transport.h"
#include "server/core/parameter_server.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {

// A shard that reported within this long is healthy.
inline constexpr absl::Duration kShardHealthyWithin = absl::Seconds(3);

// This server's report, as a shard sends it and as shard 0 shows itself.
summa::v1::ShardReport ReportOf(const ParameterServer& core);
// The same from a status snapshot of `core` the caller took already.
summa::v1::ShardReport ReportOf(const ParameterServer& core, const StatusSnapshot& s);

// Shard 0's record of the other shards' reports. Thread-safe.
class ShardBoard {
 public:
  void Record(const summa::v1::ShardReport& report, const std::string& peer, absl::Time now);
  // `self` (shard 0's own report) first, healthy, then each shard that ever reported, by shard.
  std::vector<summa::v1::ShardStatus> Statuses(const summa::v1::ShardReport& self, absl::Time now) const;

 private:
  struct Entry {
    summa::v1::ShardReport report;
    std::string peer;
    absl::Time at;
  };
  mutable absl::Mutex mu_;
  std::map<int, Entry> shards_ ABSL_GUARDED_BY(mu_);
};

// A shard other than 0: reports to shard 0 and applies the view it answers with to `core`'s
// membership (a follower's). Shard 0 holds each report for up to `interval` while the view is
// the follower's and answers when it moves (ShardReport.wait_ms), so an exclusion reaches the
// follower in one round trip; the next report goes at once. A shard 0 that answers at once (one
// from before wait_ms) is reported to every `interval`. Logs, at most every 10 s, while shard 0
// cannot be reached; after `give_up` of that (by default three leases, at least 10 s) the membership
// decides by its own leases until a report gets through again. Stops (and joins its thread)
// when destroyed.
class ShardFollower {
 public:
  ShardFollower(const std::string& coordinator, const ClientSecurity& security, ParameterServer* core,
                absl::Duration interval = absl::Milliseconds(500), absl::Duration give_up = absl::ZeroDuration());
  ~ShardFollower();
  ShardFollower(const ShardFollower&) = delete;
  ShardFollower& operator=(const ShardFollower&) = delete;

 private:
  void Loop();

  const std::string coordinator_;
  const ClientToken token_;  // its file read again when it changes
  ParameterServer* const core_;  // Not owned.
  const absl::Duration interval_;
  const absl::Duration give_up_;
  std::unique_ptr<summa::v1::ParameterServer::Stub> stub_;
  absl::Notification stop_;
  // The report in flight, which the destructor cancels (it may be held for `interval`).
  absl::Mutex call_mu_;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(call_mu_) = nullptr;
  std::thread thread_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_COORDINATION_H_
