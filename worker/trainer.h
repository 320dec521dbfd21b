// Trainer: the seed's train(num_gpus, batch_size, lr) as one worker of a job. Joins the server
// (rank 0 supplies the initial weights), resumes at the server's version, and for each step
// computes its shard's gradient, push-pulls it, and loads the next version; after each epoch it
// evaluates test accuracy and prints the seed's line. Talks to the server only through a
// ParameterStore. Owns its models and staging buffers, nothing it is given. Not thread-safe (its
// LeaseKeeper runs one heartbeat thread of its own).
#ifndef SUMMA_WORKER_TRAINER_H_
#define SUMMA_WORKER_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/trace.h"
#include "common/idx.h"
#include "worker/compute/backend.h"
#include "worker/compute/device_threads.h"
#include "client/lease_keeper.h"
#include "common/optimizer.h"
#include "worker/local_optimizer.h"
#include "worker/layer_exchange.h"
#include "worker/models/model.h"
#include "client/parameter_store.h"
#include "worker/status_board.h"

namespace summa::worker {

// The trainer's member collectives (client/parameter_store.h's Collective): each epoch's
// training loss summed, its round the 0-based epoch; and every rank's device, gathered once, at
// the first join (round 0).
inline constexpr char kLossCollective[] = "summa.train.loss";
inline constexpr char kDevicesCollective[] = "summa.train.devices";

struct TrainerOptions {
  int rank = -1;  // -1: the server assigns one
  int world_size = 1;
  int64_t batch_size = 256;  // the global minibatch, split across the world
  int epochs = 10;
  std::string model = "lenet";  // a name from ModelNames()
  // 1: data parallelism over the devices (the shard split across them). 2: model parallelism,
  // the model split across exactly two devices (pipeline.h), its batch cut into micro_batches.
  int model_parallel = 1;
  int micro_batches = 4;
  uint64_t seed = 0;           // initial weights and the epochs' shuffles
  bool progress_bar = false;   // redraw a bar with examples/s (on a terminal)
  bool evaluate = true;        // test accuracy after each epoch
  std::string status_address;  // told to the server, for operators
  // Overlap each step's exchange with the compute (LayerExchange): push each partition as soon
  // as backward has finished it, and let the next forward wait per layer for its weights. Only
  // where the store is a ParameterClient, the job's wire format dense (no top-k), and one device
  // computes the whole model; elsewhere the exchange follows the compute. Off by default: it
  // loses on 2 busy CPU cores and on a GPU (docs/design.md, "The overlapped step").
  bool overlap = false;
  // DiLoCo jobs (summa-server --mode=diloco): the optimizer of the worker's local steps between
  // exchanges (summa-worker --inner_optimizer, --inner_lr...). Unused in other jobs.
  OptimizerOptions inner;
  // How long to keep rejoining while the server is unreachable or has forgotten this worker
  // (a server restart), counted from the last step that succeeded.
  absl::Duration retry_deadline = absl::Minutes(5);
  // Called with each step's wall time (compute, push and pull), or null.
  std::function<void(absl::Duration)> step_observer;
  // Records each step's stages (stage, compute, exchange, load) when not null. Not owned.
  Tracer* tracer = nullptr;
  // Each attempt at a step appends a line here when not null (summa-worker --example_log): the
  // step, its epoch, this rank's index in the step's group, the group, and the range of the
  // epoch's order its shard covers. Not owned.
  std::FILE* example_log = nullptr;
  // Test builds (summa-worker --fault_replay_groups): from each (step, n), split each step's
  // shard over the first n devices only, so that one process with a device per rank replays the
  // splits and the rank-order sums of an elastic job whose group sizes changed at those steps.
  // Empty: every device, every step.
  std::vector<std::pair<uint64_t, int>> replay_groups;
  // Test builds (summa-worker --fault_replay_summed), with replay_groups: from each (step,
  // devices), compute and sum only these devices' shares of each step's split (device 0 among
  // them) and push their examples, so that the process replays a job with backup workers whose
  // steps summed only those ranks' pushes. Empty: every device's share.
  std::vector<std::pair<uint64_t, std::vector<int>>> replay_summed;
};

struct EpochResult {
  int epoch = 0;  // 1-based
  double loss = 0;  // mean training loss over the whole job's examples
  double test_accuracy = 0;
  double seconds = 0;  // training only, as the seed times it
  double examples_per_second = 0;
};

class Trainer {
 public:
  // None owned; all outlive the trainer. `store` is used from this thread and (Heartbeat only)
  // from the trainer's heartbeat thread. `test` may be null when options.evaluate is false.
  // With several backends the worker splits its shard across them (split_batch again) and sums
  // their gradients on the first device before it pushes: the seed's single-process method.
  Trainer(TrainerOptions options, const Dataset* train, const Dataset* test,
          std::vector<Backend*> backends, ParameterStore* store, StatusBoard* board,
          std::FILE* out);

  ~Trainer();

  absl::Status Run();

  const std::vector<EpochResult>& results() const { return results_; }
  // The weights after the last step (flat, in the model's specs order).
  const std::vector<float>& weights() const { return final_weights_; }

 private:
  absl::Status Prepare(int max_shard);
  // The training set on every device (resident_), its labels checked against the model's classes.
  absl::Status PrepareResident();
  // One attempt: join (or rejoin), pull the current weights, and train from the step the server
  // says this rank is at, to the end. `rejoining` after a lost server or membership.
  absl::Status JoinAndTrain(const std::vector<float>& initial, bool rejoining);
  // Forward and backward of the `n` examples at `begin` in this epoch's order, split across the
  // devices; the summed gradient lands in the first model's gradients. Waits for no device.
  // `devices`: the first so many (all when larger); of them only those in `summed` (sorted, 0
  // first) when not null. Returns the examples summed.
  absl::StatusOr<int64_t> ComputeGradients(int64_t begin, int n, int devices = 1 << 30,
                                           const std::vector<int>* summed = nullptr);
  // DiLoCo: exchange `step`'s local steps, global batches [first, end) of the epoch's order, each
  // split over the group as a sync step is, then its pseudo-gradient's push-pull; the weights
  // are the outer step's after it. Returns the step to push next; `examples` gets this rank's
  // examples and `global_examples` the batches'.
  absl::StatusOr<uint64_t> LocalSteps(uint64_t step, int epoch, int64_t first, int64_t end, int64_t* examples,
                                      int64_t* global_examples);
  // Whether this attempt's steps overlap their exchange (overlapping_), after its Join.
  absl::Status PlanOverlap(const JoinInfo& joined);
  // After the first Join, on a backend whose memory is the host's: the flat gradient buffer
  // moves into the store's shared values (ParameterStore::SharedValues: the shared-memory
  // plane's values segment), which the server sums straight out of. Once; nothing elsewhere.
  absl::Status ShareGradients();
  // Makes `order` (this epoch's order of the training set) every device's row indices.
  absl::Status SetOrder(const std::vector<int64_t>& order);
  // The summed loss of every device's steps since the last call (waits for the devices).
  absl::StatusOr<double> TakeLoss();
  absl::Status LoadWeights();
  absl::StatusOr<double> TestAccuracy();
  // Every rank's device ("cpu", "cuda:0 x2"), by rank, through the server's AllReduce.
  absl::StatusOr<std::vector<std::string>> DeviceNames();
  // "[cpu, cuda:0]": the devices of `ranks`; "[cpu ...]" when the names are not known.
  std::string DevicesOf(const std::vector<int>& ranks) const;
  // The job's {summed loss, examples} of epoch `epoch` (0-based) from this member's, summed by
  // the member collective "summa.train.loss" (round = epoch); this member's own where the
  // collective fails for a reason other than a lost server (UNAVAILABLE) or an ended job
  // (ABORTED), which are returned.
  absl::StatusOr<std::vector<float>> EpochLoss(int epoch, double loss_sum, int64_t examples);
  void DrawProgress(int epoch, int64_t done, int64_t total, double rate);

  const TrainerOptions options_;
  const Dataset* const train_;   // Not owned.
  const Dataset* const test_;    // Not owned.
  const std::vector<Backend*> backends_;  // Not owned.
  ParameterStore* const store_;  // Not owned.
  StatusBoard* const board_;     // Not owned.
  std::FILE* const out_;         // Not owned.
  int rank_ = -1;
  std::vector<std::unique_ptr<Model>> models_;  // one per backend
  std::unique_ptr<DeviceThreads> device_threads_;  // computes on every backend at once
  // Host staging from the first backend (pinned on CUDA) for the push and pull, allocated once.
  std::unique_ptr<DeviceBuffer> weights_, gradients_;
  // The training set on each device, uploaded once, and the epoch's order as row indices
  // (Examples::Resident). Where a device's memory is the host's, the host arrays serve in place
  // and the buffers stay null.
  struct Resident {
    std::unique_ptr<DeviceBuffer> images, labels, order;
    const float* image_table = nullptr;
    const float* label_table = nullptr;
    const float* rows = nullptr;
  };
  std::vector<Resident> resident_;  // one per backend
  std::vector<float> train_labels_;  // the training labels as floats
  std::vector<float> order_rows_;    // this epoch's order as floats
  int max_shard_ = 0;
  std::unique_ptr<DeviceBuffer> peer_gradients_;  // on the first device, for summing
  std::vector<float> final_weights_;
  std::vector<float> initial_weights_;  // the model's seeded weights, defining it at the server
  std::vector<EpochResult> results_;
  std::vector<int> live_;      // the group the data is sharded over
  std::vector<std::string> device_names_;  // by rank; empty when not gathered
  std::string mode_;           // "sync mode", "async mode" or "ssp mode, staleness K"
  // Steps this process completed, over all attempts: these, and overlap_'s steps_finished().
  uint64_t steps_done_ = 0;
  // DiLoCo (sync_every_ > 0): the inner optimizer and the anchor, made at the first such Join.
  int sync_every_ = 0;
  std::unique_ptr<LocalOptimizer> local_;
  std::unique_ptr<LayerExchange> overlap_;  // made at the first Join that can overlap
  bool overlapping_ = false;                // this attempt's steps go through overlap_
  bool gradients_asked_ = false;            // ShareGradients ran
  LeaseKeeper leases_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_TRAINER_H_
