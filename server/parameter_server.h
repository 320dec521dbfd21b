// ParameterServer: the daemon's core, free of gRPC. It learns the model from the first Join that
// carries values, holds the master weights and optimizer state per partition, sums each step's
// pushes on arrival, and in sync mode applies the optimizer when every member has pushed a
// partition, advancing that partition's version. Pulls for a version not ready yet are parked and
// released when the step completes, or expired at their deadline.
//
// Each partition is a small state machine under its own lock (BytePS's per-key design), so
// partitions aggregate in parallel. Thread-safe.
#ifndef SUMMA_SERVER_PARAMETER_SERVER_H_
#define SUMMA_SERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <cstdint>
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

namespace summa::server {

enum class Mode { kSync };

struct ServerOptions {
  int world_size = 1;
  Mode mode = Mode::kSync;
  SgdOptions sgd;
  int64_t partition_bytes = 4 << 20;
  // How long a pull may wait for its step, counted from the pull's arrival.
  absl::Duration barrier_deadline = absl::Minutes(10);
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
  std::vector<PartitionRange> partitions;
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

struct MemberInfo {
  int rank = 0;
  std::string peer;
  std::string status_address;
  uint64_t pushes = 0;
  uint64_t examples = 0;
  absl::Time last_seen;
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
  absl::Duration last_step = absl::ZeroDuration();
  absl::Duration uptime;
  std::string optimizer;
};

class ParameterServer {
 public:
  explicit ParameterServer(ServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Admits a member. INVALID_ARGUMENT for a wrong world size, a rank outside the group or a bad
  // tensor; FAILED_PRECONDITION when the model differs from the server's; UNAVAILABLE when no
  // one has supplied initial values yet (retry after rank 0 has joined).
  absl::StatusOr<JoinResult> Join(const JoinRequestView& request);

  // Adds a gradient for one partition of one step; true when it completed the step. Every
  // refusal changes nothing: INVALID_ARGUMENT (rank, partition, dtype, length, example count),
  // FAILED_PRECONDITION (no model, rank not joined, step already finished), OUT_OF_RANGE (step
  // in the future), ALREADY_EXISTS (this rank already pushed this partition for this step).
  absl::StatusOr<bool> Push(const PushRequestView& request);

  // Answers `call` with the partition's weights once its version is >= min_version; parks it
  // until then (up to the barrier deadline). Errors finish the call at once.
  void Pull(int rank, uint32_t partition, uint64_t min_version, const std::string& peer,
            std::shared_ptr<ParkedCall> call);

  // Push, then pull version step + 1 of the same partition, answering `call` either way.
  void PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call);

  // Finishes every parked pull whose deadline is at or before `now` with DEADLINE_EXCEEDED,
  // naming the ranks the step still waits for. Returns the next deadline to check at.
  absl::Time ExpireParked(absl::Time now);

  // Fails every parked call with UNAVAILABLE: the server is going down.
  void Shutdown();

  StatusSnapshot Status() const;

  // A copy of the full flat weights, for tests and checkpoints; empty before the model exists.
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
    StepBarrier barrier ABSL_GUARDED_BY(mu);
    ParkingLot parked ABSL_GUARDED_BY(mu);
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
  absl::Status DefineModel(const JoinRequestView& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSameModel(const JoinRequestView& request) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckMember(int rank) const;
  void Touch(int rank, const std::string& peer, uint64_t pushes, uint64_t examples);
  void PullFrom(const Model& model, uint32_t partition, uint64_t min_version,
                std::shared_ptr<ParkedCall> call);
  // Why a parked pull on `state` is still waiting.
  std::string WaitingFor(const PartitionState& state) const ABSL_SHARED_LOCKS_REQUIRED(state.mu);

  const ServerOptions options_;
  const SgdOptimizer optimizer_;
  const absl::Time started_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Model> model_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> joined_ ABSL_GUARDED_BY(mu_);
  std::vector<MemberInfo> members_ ABSL_GUARDED_BY(mu_);

  // Atomic, not under mu_: PullFrom reads it under a partition lock (lock order: mu_, then a
  // partition's mu).
  std::atomic<bool> shut_down_{false};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::atomic<uint64_t> pushes_served_{0};
  std::atomic<uint64_t> pulls_served_{0};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_PARAMETER_SERVER_H_
