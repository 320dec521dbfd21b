// ParameterServer: the daemon's core, free of gRPC. It learns the model from the first Join that
// carries values (or from a checkpoint), holds the master weights and optimizer state per
// partition, and applies pushes according to the consistency mode:
//  - sync: pushes are summed on arrival; when every member has pushed a partition for the step,
//    the optimizer runs on the sum divided by the examples covered and the version advances;
//  - async: each push is applied on arrival with its own example count;
//  - ssp: as async, but a push-pull more than `staleness` steps ahead of the slowest member waits.
// Pulls that cannot be answered yet are parked and answered when the step completes, or at their
// deadline. Members hold leases renewed by every call and by Heartbeat; a lapsed member is waited
// for (`wait`, up to the rejoin deadline, after which the job ends) or dropped (`shrink`).
//
// Each partition is a small state machine under its own lock (BytePS's per-key design), so
// partitions aggregate in parallel. Lock order: mu_, then a partition's mu. Thread-safe.
#ifndef SUMMA_SERVER_PARAMETER_SERVER_H_
#define SUMMA_SERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "server/aggregator.h"
#include "server/optimizer.h"
#include "server/parked_call.h"
#include "server/step_barrier.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

enum class Mode { kSync, kAsync, kSsp };
enum class OnWorkerLoss { kWait, kShrink };

const char* ModeName(Mode mode);

struct ServerOptions {
  int world_size = 1;
  Mode mode = Mode::kSync;
  int staleness = 0;  // ssp: how many steps a worker may run ahead of the slowest
  SgdOptions sgd;
  int64_t partition_bytes = 4 << 20;
  // How long a pull may wait for its step, counted from the pull's arrival.
  absl::Duration barrier_deadline = absl::Minutes(10);
  // A member that makes no call for this long has lapsed.
  absl::Duration lease = absl::Seconds(10);
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kWait;
  // wait: how long a lapsed member may take to rejoin before the job ends.
  absl::Duration rejoin_deadline = absl::Minutes(5);
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only at shutdown
  // Called with each step's duration (partition 0, under its lock: keep it cheap), or null.
  std::function<void(absl::Duration)> step_observer;
};

absl::Status ValidateOptions(const ServerOptions& options);

// A tensor as a Join carries it: its description, and its values or nothing.
struct JoinTensor {
  TensorSpec spec;
  absl::string_view data;  // raw little-endian float32, or empty
};

struct JoinRequestView {
  int rank = -1;  // -1: assign the lowest rank not yet joined
  int world_size = 0;
  std::vector<JoinTensor> params;
  std::string peer;
  std::string status_address;
};

struct JoinResult {
  int rank = 0;
  uint64_t version = 0;
  // The step this rank pushes next: the version in sync mode, the rank's own count otherwise.
  uint64_t next_step = 0;
  std::vector<PartitionRange> partitions;
  std::vector<int> live_ranks;
};

struct PushRequestView {
  int rank = 0;
  uint64_t step = 0;
  uint32_t partition = 0;
  int64_t num_examples = 0;
  bool dtype_is_float32 = true;
  absl::string_view data;
  std::string peer;
};

enum class MemberState { kAbsent, kAlive, kLapsed, kLeft, kDropped };
const char* MemberStateName(MemberState state);

struct MemberInfo {
  int rank = 0;
  MemberState state = MemberState::kAbsent;
  std::string peer;
  std::string status_address;
  uint64_t pushes = 0;
  uint64_t examples = 0;
  absl::Time last_seen = absl::InfinitePast();
  absl::Time lease_expiry = absl::InfinitePast();
  absl::Time lapsed_at = absl::InfinitePast();
  int joins = 0;
};

struct CheckpointInfo {
  std::string path;
  uint64_t version = 0;
  absl::Time written = absl::InfinitePast();
};

struct StatusSnapshot {
  uint64_t version = 0;
  Mode mode = Mode::kSync;
  int world_size = 0;
  bool model_defined = false;
  std::vector<TensorSpec> params;
  int64_t parameter_count = 0;
  int partition_count = 0;
  int64_t partition_bytes = 0;
  std::vector<MemberInfo> members;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t pushes_served = 0;
  uint64_t pulls_served = 0;
  uint64_t duplicate_pushes = 0;
  absl::Duration last_step = absl::ZeroDuration();
  absl::Duration uptime;
  std::string optimizer;
  CheckpointInfo checkpoint;
  std::string job_error;  // why the job ended, when it did
};

class ParameterServer {
 public:
  explicit ParameterServer(ServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Takes the model, weights, optimizer state and version from a checkpoint; before any Join.
  // FAILED_PRECONDITION when the checkpoint's job differs from the options.
  absl::Status Restore(const summa::v1::Checkpoint& checkpoint);

  // Admits (or readmits) a member. INVALID_ARGUMENT for a wrong world size, a rank outside the
  // group or a bad tensor; FAILED_PRECONDITION when the model differs from the server's or the
  // rank was dropped; UNAVAILABLE when no one has supplied initial values yet (retry).
  absl::StatusOr<JoinResult> Join(const JoinRequestView& request);

  // Renews `rank`'s lease. NOT_FOUND when it is not a member, FAILED_PRECONDITION when dropped.
  absl::Status Heartbeat(int rank, const std::string& peer);

  // Takes `rank` out of the group for good; the steps go on without it.
  absl::Status Leave(int rank);

  // Adds (sync) or applies (async, ssp) a gradient for one partition of one step; true when it
  // completed the step (sync) or was applied. Every refusal changes nothing: INVALID_ARGUMENT
  // (rank, partition, dtype, length, example count), NOT_FOUND (not a member: Join again),
  // FAILED_PRECONDITION (no model, step already finished, rank dropped), OUT_OF_RANGE (step in
  // the future), ALREADY_EXISTS (this rank already pushed this partition for this step: a retry,
  // never summed twice), ABORTED (the job has ended).
  absl::StatusOr<bool> Push(const PushRequestView& request);

  // Answers `call` with the partition's weights once its version is >= min_version; parks it
  // until then (up to the barrier deadline). Errors finish the call at once.
  void Pull(int rank, uint32_t partition, uint64_t min_version, const std::string& peer,
            std::shared_ptr<ParkedCall> call);

  // Push, then answer with the partition's next weights: version step + 1 in sync mode (a retried
  // push that was already counted only pulls), the newest in async mode, and the newest once the
  // slowest member is within `staleness` steps in ssp mode.
  void PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call);

  // Lapses expired leases (dropping them under `shrink`, ending the job under `wait` once the
  // rejoin deadline passes) and finishes parked pulls past their deadline with
  // DEADLINE_EXCEEDED, naming the ranks the step still waits for.
  void Tick(absl::Time now);

  // Writes a checkpoint when one is due (every `checkpoint_every` steps), or at once when
  // `force`. FAILED_PRECONDITION while partitions are between versions of one step (retry).
  absl::Status MaybeCheckpoint(bool force);

  // Fails every parked call with UNAVAILABLE: the server is going down.
  void Shutdown();

  // Empty while the job runs; why it ended otherwise.
  std::string job_error() const;

  // The ranks still in the group (not dropped, not left), ascending: the workers re-shard the
  // data over these. Stable under any partition lock.
  std::vector<int> LiveRanks() const;

  StatusSnapshot Status() const;

  // A copy of the full flat weights, for tests; empty before the model exists.
  std::vector<float> WeightsForTest() const;
  const ServerOptions& options() const { return options_; }

 private:
  struct PartitionState {
    PartitionState(PartitionRange range, int world_size, absl::Span<const float> initial);
    const PartitionRange range;
    mutable absl::Mutex mu;
    uint64_t version ABSL_GUARDED_BY(mu) = 0;
    std::vector<float> weights ABSL_GUARDED_BY(mu);
    std::vector<float> velocity ABSL_GUARDED_BY(mu);
    Aggregator aggregator ABSL_GUARDED_BY(mu);
    StepBarrier barrier ABSL_GUARDED_BY(mu);       // sync
    std::vector<uint64_t> next_step ABSL_GUARDED_BY(mu);  // async, ssp: per rank
    ParkingLot parked ABSL_GUARDED_BY(mu);         // waiting for a version
    ParkingLot clock_parked ABSL_GUARDED_BY(mu);   // ssp: waiting for the slowest member
    absl::Time last_completion ABSL_GUARDED_BY(mu);
    absl::Duration last_step ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  };
  // Immutable once defined, apart from the partitions' own locked state.
  struct Model {
    explicit Model(PartitionMap m) : map(std::move(m)) {}
    PartitionMap map;
    std::vector<std::unique_ptr<PartitionState>> partitions;
  };

  std::shared_ptr<const Model> model() const;
  absl::Status BuildModel(std::vector<TensorSpec> specs, const std::vector<float>& flat)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DefineModel(const JoinRequestView& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSameModel(const JoinRequestView& request) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // OK for an alive or lapsed member (and renews its lease); the status to refuse with otherwise.
  absl::Status CheckMember(int rank, const std::string& peer, uint64_t pushes, uint64_t examples);
  // Takes `ranks` out of every partition's barrier and clock, completing what that completes.
  void Exclude(const std::vector<int>& ranks);
  // Sync: applies the step if every expected rank has arrived.
  void MaybeCompleteStep(PartitionState& state, absl::Time now, CallsToFinish& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu);
  // Async/ssp: the lowest next step over the ranks still in the group.
  uint64_t SlowestStep(const PartitionState& state) const ABSL_SHARED_LOCKS_REQUIRED(state.mu);
  void PullFrom(const Model& model, uint32_t partition, uint64_t min_version,
                std::shared_ptr<ParkedCall> call);
  void EndJob(const std::string& why);
  // Why a parked pull on `state` is still waiting.
  std::string WaitingFor(const PartitionState& state) const ABSL_SHARED_LOCKS_REQUIRED(state.mu);
  absl::Status Answerable() const;

  const ServerOptions options_;
  const SgdOptimizer optimizer_;
  const absl::Time started_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Model> model_ ABSL_GUARDED_BY(mu_);
  std::vector<MemberInfo> members_ ABSL_GUARDED_BY(mu_);
  // Ranks excluded from the barriers (dropped or left); read under a partition lock, so atomic.
  std::vector<std::atomic<bool>> excluded_;
  CheckpointInfo checkpoint_ ABSL_GUARDED_BY(mu_);
  // A leaf lock: read under partition locks when refusing calls after the job ended.
  mutable absl::Mutex error_mu_;
  std::string job_error_ ABSL_GUARDED_BY(error_mu_);
  absl::Mutex checkpoint_mu_;  // one checkpoint written at a time

  // Atomic, not under mu_: read under partition locks.
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> job_ended_{false};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::atomic<uint64_t> pushes_served_{0};
  std::atomic<uint64_t> pulls_served_{0};
  std::atomic<uint64_t> duplicate_pushes_{0};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_PARAMETER_SERVER_H_
