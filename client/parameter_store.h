// ParameterStore: what the trainer needs from the parameter server, in ps-lite's shape: join the
// group, pull the weights, push a gradient and pull the next weights, renew the lease, leave, and
// sum small tensors across the group. ParameterClient (ps_client.h) speaks it over gRPC to
// summa-server; tests put an in-memory store behind it; FaultInjectingStore wraps another.
//
// Implementations are not thread-safe, except Heartbeat, which a second thread may call at any
// time.
#ifndef SUMMA_CLIENT_PARAMETER_STORE_H_
#define SUMMA_CLIENT_PARAMETER_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compression.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "summa/v1/summa.pb.h"

namespace summa::worker {

struct JoinInfo {
  int rank = 0;
  uint64_t version = 0;
  uint64_t next_step = 0;  // where this rank resumes
  summa::v1::Mode mode = summa::v1::MODE_SYNC;
  int staleness = 0;
  // Sync mode: the job's backup workers (summa-server --backup_workers): a push may come late,
  // and PushPull then moves on past the steps this rank missed.
  int backup_workers = 0;
  // DiLoCo (summa-server --mode=diloco): the local steps between exchanges, H; 0 otherwise.
  int sync_every = 0;
  absl::Duration lease = absl::Seconds(10);
  std::vector<PartitionRange> partitions;
  std::vector<int> live_ranks;
  // The job's wire format (summa-server --wire_dtype, --compress), for the log.
  WireDType wire_dtype = WireDType::kFloat32;
  Compression compression;
};

// Who takes part in one AllReduce.
struct Collective {
  std::string name;
  int rank = 0;
  // A fixed group: a round completes when `group_size` distinct ranks in [0, group_size) have
  // contributed. With `members`, the server ignores it.
  int group_size = 0;
  // Over the job's members instead: `rank` is the member rank, and round `round` completes when
  // every member still in the group has contributed (dropped members left out, lapsed ones
  // waited for). A contribution to the round that just completed is answered at once with its
  // sum; an older round is FAILED_PRECONDITION; ABORTED when the job ends.
  bool members = false;
  uint64_t round = 0;
  // How long the call may wait, at most (and at most the client's call deadline): a collective
  // that is only nice to have gives up early.
  absl::Duration timeout = absl::InfiniteDuration();
};

class ParameterClient;

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  // Joins as `rank` of `world` (-1: the server assigns one). `initial` (the flat weights, or
  // null) defines the model when the server has none; every later joiner's specs must match.
  virtual absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                        const float* initial, const std::string& status_address) = 0;

  // Fills `weights` (flat) with every partition at version >= min_version; returns the version
  // (the lowest). In a sync job with backup workers every partition at one version, returned.
  virtual absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) = 0;

  // Pushes the flat `gradients` of `num_examples` examples for `step` and fills `weights` with
  // the next weights (version step + 1 in sync mode, the newest otherwise) and `live_ranks`
  // with the group for the next step. Returns the step to push next: step + 1, or in a sync job
  // with backup workers, where this push came late and the others went on, a later one, whose
  // weights (every partition at that version) `weights` then holds.
  virtual absl::StatusOr<uint64_t> PushPull(uint64_t step, int64_t num_examples, const float* gradients,
                                            float* weights, std::vector<int>* live_ranks) = 0;

  // Pushes without pulling (the push replies at once). Returns whether the push completed the
  // step.
  virtual absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float* gradients) = 0;

  // Renews this member's lease. Thread-safe.
  virtual absl::Status Heartbeat(int rank) const = 0;
  // Leaves the group for good.
  virtual absl::Status Leave(int rank) = 0;

  // The seed's allreduce through the server: the elementwise sum of `values` over `group`.
  virtual absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                                       const std::vector<float>& values) = 0;

  // Where the store is, for people ("127.0.0.1:50051").
  virtual std::string address() const = 0;

  // The client a step can be exchanged through partition by partition (StepExchange,
  // client/step_exchange.h) while the trainer computes, or null (the default) where the store
  // exchanges whole steps only: a test's store, or one that wraps the client.
  virtual ParameterClient* staged_client() { return nullptr; }

  // After Join: a flat buffer of `floats` that pushes from copy nothing (the shared-memory
  // plane's values segment, ParameterClient::SharedValues), or null (the default) where there
  // is none: gradients then go from the caller's own memory.
  virtual absl::StatusOr<float*> SharedValues(size_t floats) { return nullptr; }
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_PARAMETER_STORE_H_
