// ConsistencyPolicy: what a push does to its partition and when a push-pull is answered, chosen
// once per job from the mode:
//  - sync: pushes are summed on arrival; when every rank of the group the step runs under
//    (server/core/group_view.h: the ranks admitted by that step, less those excluded since; a
//    step whose unpushed member is excluded starts again under the new group) has pushed a
//    partition for the step, the optimizer runs on the sum divided by the examples covered and
//    the version advances (the seed's bulk-synchronous step); with backup workers (B =
//    PolicyContext::backup_workers > 0) once the first max(1, group size - B) ranks of the group
//    have, and a push of a step the partition completed without it is late: dropped, counted in
//    Partition::lateness, refused with FAILED_PRECONDITION and reason kLatePush (a push-pull of
//    it is then answered with the newest weights: ParameterServer::PushPull). Each partition
//    decides alone which ranks it sums: where pushes of a step race, two partitions of it may sum
//    different ranks (each update is still the mean gradient of the examples it summed);
//  - async: each push is applied on arrival with its own example count (DiLoCo's
//    pseudo-gradients: with its examples times the group's size, a share of a whole group's);
//  - ssp: as async, but a push-pull more than `staleness` steps ahead of the slowest member waits.
// Every method runs with the partition's lock held and collects the calls it answers in `out`,
// to be finished after the lock is released. A push is identified by (rank, step, partition):
// one already counted is ALREADY_EXISTS and changes nothing. Immutable; thread-safe.
#ifndef SUMMA_SERVER_CORE_CONSISTENCY_H_
#define SUMMA_SERVER_CORE_CONSISTENCY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/compression.h"
#include "server/core/job_options.h"
#include "server/core/membership.h"
#include "common/optimizer.h"
#include "server/core/parked_call.h"
#include "server/core/partition.h"

namespace summa::server {

struct PushRequestView {
  uint64_t session = 0;  // the pusher's, from its Join
  std::optional<uint64_t> view;  // the membership view it stamped the push with, if any
  int rank = 0;
  uint64_t step = 0;
  uint32_t partition = 0;
  int64_t num_examples = 0;
  // The values' dtype on the wire; nullopt for one the server does not know (refused).
  std::optional<WireDType> dtype = WireDType::kFloat32;
  // `data` is the sparse layout of common/compression.h (top-k), not the whole partition.
  bool sparse = false;
  absl::string_view data;
  std::string peer;
  // `data` is memory its sender may still write (the shared-memory plane's segment): the values
  // are summed with non-finite entries taken as zero, so that a value changed after the check
  // cannot bring a NaN into the sum (the sender can change only its own contribution).
  bool shared = false;
};

// How the values of a checked push are taken.
enum class PushValues { kAsSent, kZeroNonFinite, kSkip };

struct PolicyContext {
  const Optimizer* optimizer = nullptr;   // Not owned.
  const Membership* members = nullptr;    // Not owned.
  int staleness = 0;
  int backup_workers = 0;  // sync: ServerOptions::backup_workers
  int sync_every = 0;      // DiLoCo: ServerOptions::sync_every
  std::function<void(absl::Duration)> step_observer;  // may be null
  Tracer* tracer = nullptr;                            // Not owned; may be null.
};

class ConsistencyPolicy {
 public:
  static std::unique_ptr<const ConsistencyPolicy> Create(Mode mode, PolicyContext context);
  virtual ~ConsistencyPolicy() = default;

  // Takes a validated push from a member, its values decoded to float32 in `gradient`. True when
  // it completed its step (sync) or was applied. ALREADY_EXISTS for a push already counted;
  // FAILED_PRECONDITION for a finished step or a rank out of the group (with backup workers, a
  // finished step's push is late: reason kLatePush, counted once in the rank's lateness);
  // OUT_OF_RANGE for a future step. Refusals change nothing else.
  virtual absl::StatusOr<bool> Push(Partition& p, const PushRequestView& r, absl::Span<const float> gradient,
                                    PushValues values, absl::Time now, CallsToFinish& out) const = 0;
  // After the membership shrank: completes what that completes (sync: or starts the step again
  // under the new group, when a rank that had not pushed it is out).
  virtual void OnExcluded(Partition& p, absl::Time now, CallsToFinish& out) const = 0;
  // `rank` joins the group from step `from_step` (sync; async and ssp: at once, where the slowest
  // member is): the step it pushes next on `p`.
  virtual void OnAdmitted(Partition& p, int rank, uint64_t from_step) const = 0;
  // Answers `call` with the weights a push-pull of `step` waits for, or parks it until `deadline`.
  // `rank` pushed it (sync: a push a restart dropped since is told so).
  virtual void AnswerPushPull(Partition& p, int rank, uint64_t step, std::shared_ptr<ParkedCall> call,
                              absl::Time deadline, CallsToFinish& out) const = 0;
  // OUT_OF_RANGE for a pull of a version no wait can bring; OK otherwise.
  virtual absl::Status CheckPull(const Partition& p, uint64_t min_version) const = 0;
  // The step `rank` pushes next on `p`.
  virtual uint64_t NextStep(const Partition& p, int rank) const = 0;
  // Why a call parked on `p` still waits, for its DEADLINE_EXCEEDED.
  virtual std::string WaitingFor(const Partition& p) const = 0;
  // Sync checkpoints need every partition at one version; async ones record each partition's.
  virtual bool CheckpointNeedsOneVersion() const = 0;
  virtual Mode mode() const = 0;

 protected:
  explicit ConsistencyPolicy(PolicyContext context) : ctx_(std::move(context)) {}
  // Applies one update (unless `skip`) from `grad_sum` over `examples`, advances the version and
  // releases the pulls it satisfies.
  void Advance(Partition& p, absl::Span<const float> grad_sum, int64_t examples, bool skip,
               absl::Time now, CallsToFinish& out) const;
  absl::Status Duplicate(const PushRequestView& r) const;
  // `p.step_group`, the group of the partition's current step (Membership::GroupAt), read again
  // when the membership moved or the version reached an admission.
  const GroupView& StepGroup(Partition& p) const;

  const PolicyContext ctx_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_CONSISTENCY_H_
