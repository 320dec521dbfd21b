// Partition: one slice of the flat parameter buffer and everything the server keeps for it: the
// master weights, the optimizer's state slots, the step's running sum, who has pushed, and the
// calls parked on it. A plain state holder; the consistency policy drives it. Every field but
// `range` is guarded by `mu` (BytePS's per-key state machine: partitions never share a lock).
#ifndef SUMMA_SERVER_CORE_PARTITION_H_
#define SUMMA_SERVER_CORE_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partition_map.h"
#include "server/core/aggregator.h"
#include "server/core/group_view.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/parked_call.h"
#include "server/core/snapshot.h"
#include "server/core/step_barrier.h"

namespace summa::server {

// Sync mode with backup workers (--backup_workers): how late one rank's pushes to a partition
// come. The delay of a push is the time from its step's first push (on this partition) to it.
struct RankLateness {
  uint64_t late_pushes = 0;  // dropped: the step had completed without them
  uint64_t timed_pushes = 0;   // pushes whose delay is in total_delay (on time, and late ones of recent steps)
  absl::Duration total_delay = absl::ZeroDuration();
  absl::Duration last_delay = absl::ZeroDuration();
  // At its last push: the steps the partition had completed past the step pushed (0 on time).
  uint64_t steps_behind = 0;
  uint64_t last_late_step = UINT64_MAX;  // a retry of this dropped push is not counted again

  absl::Duration mean_delay() const {
    return timed_pushes == 0 ? absl::ZeroDuration() : total_delay / static_cast<int64_t>(timed_pushes);
  }
};

struct Partition {
  // `deterministic`: the aggregator keeps each rank's push and sums them in rank order.
  Partition(PartitionRange r, int world_size, absl::Span<const float> initial, int num_slots,
            absl::Time now, bool deterministic = false)
      : range(r),
        weights(initial.empty() ? std::vector<float>(r.length, 0.0f)
                                : std::vector<float>(initial.begin(), initial.end())),
        initialized(!initial.empty()),
        slots(num_slots, std::vector<float>(r.length, 0.0f)),
        aggregator(r.length, deterministic ? world_size : 0),
        barrier(world_size),
        next_step(world_size, 0),
        step_group(GroupView::Whole(world_size)),
        lateness(world_size),
        last_completion(now) {
    for (auto& s : slots) slot_views.push_back(absl::MakeSpan(s));
  }

  const PartitionRange range;
  // The first partition this server holds: its steps are the ones status and metrics report
  // (step time, learning rate). Set once, before the model is published.
  bool reports = false;
  mutable absl::Mutex mu;
  // Updates applied: steps completed (sync) or pushes applied (async, ssp).
  uint64_t version ABSL_GUARDED_BY(mu) = 0;
  // Optimizer updates applied: the version less the steps that applied none (skipped, or no
  // examples). Adam's bias correction counts these; the schedule counts versions.
  uint64_t updates ABSL_GUARDED_BY(mu) = 0;
  std::vector<float> weights ABSL_GUARDED_BY(mu);
  bool initialized ABSL_GUARDED_BY(mu);  // the weights hold the model's initial values
  std::vector<std::vector<float>> slots ABSL_GUARDED_BY(mu);  // the optimizer's, by SlotNames()
  std::vector<absl::Span<float>> slot_views ABSL_GUARDED_BY(mu);
  Aggregator aggregator ABSL_GUARDED_BY(mu);
  StepBarrier barrier ABSL_GUARDED_BY(mu);               // sync: who pushed the current step
  std::vector<uint64_t> next_step ABSL_GUARDED_BY(mu);   // per rank: the step it pushes next
  // The group the current step runs under (Membership::GroupAt the version: sync, the ranks
  // admitted by the step less those excluded since; async and ssp, the current group).
  // ConsistencyPolicy::StepGroup keeps it.
  GroupView step_group ABSL_GUARDED_BY(mu);
  uint64_t step_group_epoch ABSL_GUARDED_BY(mu) = 0;  // Membership::group_epoch() it was read at
  // The step from which an admission known when it was read changes step_group.
  uint64_t step_group_until ABSL_GUARDED_BY(mu) = 0;
  // Sync: steps started again under a new group (ConsistencyPolicy::OnExcluded), and the
  // examples of the steps completed (what the updates were divided by).
  uint64_t restarts ABSL_GUARDED_BY(mu) = 0;
  uint64_t examples_applied ABSL_GUARDED_BY(mu) = 0;
  // Sync with backup workers: per rank, how late its pushes come; and when the first push of
  // each of the last kRecentSteps completed steps came (step_began[s % kRecentSteps], valid
  // where began_step holds s), the origin of a late push's delay.
  std::vector<RankLateness> lateness ABSL_GUARDED_BY(mu);
  static constexpr int kRecentSteps = 64;
  std::vector<absl::Time> step_began ABSL_GUARDED_BY(mu) = std::vector<absl::Time>(kRecentSteps);
  std::vector<uint64_t> began_step ABSL_GUARDED_BY(mu) = std::vector<uint64_t>(kRecentSteps, UINT64_MAX);
  bool skip_step ABSL_GUARDED_BY(mu) = false;            // sync: a push under --nonfinite=skip_step
  ParkingLot parked ABSL_GUARDED_BY(mu);        // waiting for a version
  ParkingLot clock_parked ABSL_GUARDED_BY(mu);  // ssp: waiting for the slowest member
  absl::Time last_completion ABSL_GUARDED_BY(mu);
  absl::Duration last_step ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  // Sync shards' checkpoints: the partition as it was when it reached `frozen.version`, the newest
  // multiple of --checkpoint_every it reached (taken then, into buffers reused each time), for
  // the checkpoint writer; `has_frozen` until then.
  PartitionSnapshot frozen ABSL_GUARDED_BY(mu);
  bool has_frozen ABSL_GUARDED_BY(mu) = false;
  // The model this partition belongs to was replaced by a rollback: every call is refused.
  bool retired ABSL_GUARDED_BY(mu) = false;

  // The weights as of `version`, shared by every reply that sends them: copied once per version
  // (the first time a reply needs it) into a buffer of `snapshots`, never once per reply.
  const Snapshot& Published() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (published.empty() || published_version != version) {
      float* out;
      published = snapshots.Acquire(range.length, &out);
      std::copy(weights.begin(), weights.end(), out);
      published_version = version;
    }
    return published;
  }
  // Answers the calls of `lot` (parked or clock_parked) whose target is <= `counter` with the
  // weights as they are now.
  void Release(ParkingLot& lot, uint64_t counter, CallsToFinish& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    lot.Release(counter, version, [this]() -> const Snapshot& { return Published(); }, out);
  }
  SnapshotPool snapshots ABSL_GUARDED_BY(mu);
  Snapshot published ABSL_GUARDED_BY(mu);
  uint64_t published_version ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_PARTITION_H_
