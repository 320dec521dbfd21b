// PipelinedLeNet: the seed's other way to use two devices, model parallelism. LeNet's
// convolutions (LeNetFeatures) run on one device and its dense layers (LeNetHead) on another;
// the activations between them go forward and their gradients come back through host memory.
// Each batch is cut into micro-batches that flow through the two stages as a pipeline (GPipe,
// Huang et al. 2019): stage 0 runs every micro-batch's forward pass, handing each to stage 1 as
// it is done, then their backward passes as stage 1 hands their gradients back; stage 1 runs each
// micro-batch's forward and backward passes at once. Each stage runs on a thread of its own and
// sums its micro-batches' gradients on its own device.
//
// To the trainer it is one Model (model.h): the worker pushes and pulls as one rank. Not
// thread-safe; each backend must be used by this model alone, and outlive it.
#ifndef SUMMA_WORKER_MODELS_PIPELINE_H_
#define SUMMA_WORKER_MODELS_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/compute/backend.h"
#include "worker/compute/device_threads.h"
#include "worker/models/lenet.h"
#include "worker/models/model.h"

namespace summa::worker {

class PipelinedLeNet final : public Model {
 public:
  // Where a step's time went, summed over ComputeGradients calls: each stage's busy time (its
  // passes, copies and sums, not its waits for the other) and the steps' wall time. The bubble
  // is what the stages spend waiting: 1 - (stage 0 + stage 1) / (2 x step).
  struct Timing {
    absl::Duration stage[2];
    absl::Duration steps;
    int64_t count = 0;
  };

  // Stage 0 (the convolutions) on `first`, stage 1 (the dense layers) on `second`, with every
  // buffer for batches of up to `max_batch` examples allocated once; a batch is cut into
  // `micro_batches` (at least 1; fewer when the batch has fewer examples).
  static absl::StatusOr<std::unique_ptr<PipelinedLeNet>> Create(Backend* first, Backend* second, int max_batch,
                                                                int micro_batches);

  // Model:
  std::string name() const override { return LeNet::kName; }
  std::vector<TensorSpec> specs() const override { return LeNet::Specs(); }
  int64_t num_params() const override { return LeNet::NumParams(); }
  std::vector<float> InitialWeights(uint64_t seed) const override { return LeNet::SeedWeights(seed); }
  int image_floats() const override { return LeNet::kImageFloats; }
  int classes() const override { return LeNet::kClasses; }
  int max_batch() const override { return max_batch_; }
  absl::Status SetWeights(const float* host_flat) override;
  // `examples` must be on the first device (Examples::Host, or tables resident there).
  absl::Status ComputeGradients(const Examples& examples, int n) override;
  absl::StatusOr<double> TakeLoss() override;
  absl::Status GetGradients(float* host_flat) override;
  absl::StatusOr<int64_t> CountCorrect(const float* images, const float* labels, int n) override;
  DeviceBuffer* weights() override { return nullptr; }    // split: see the stages' buffers
  DeviceBuffer* gradients() override { return nullptr; }

  int micro_batches() const { return micro_batches_; }
  const Timing& timing() const { return timing_; }
  void ResetTiming() { timing_ = Timing(); }

 private:
  PipelinedLeNet(Backend* first, Backend* second, int max_batch, int micro_batches)
      : first_(first), second_(second), max_batch_(max_batch), micro_batches_(micro_batches), threads_(2) {}
  // Micro-batch i of a batch of n cut into m: examples [Begin(i), Begin(i + 1)).
  static int Begin(int i, int n, int m) { return static_cast<int>(int64_t{i} * n / m); }
  absl::Status RunStage0(const Examples& examples, int n, int m);
  absl::Status RunStage1(int n, int m);
  // Waits until `*counter` > i (the other stage has handed micro-batch i over) or the other stage
  // failed (ABORTED); the time waited is not the stage's busy time.
  absl::Status WaitFor(const int* counter, int i, absl::Duration* waited);
  void Hand(int* counter, int i);
  void Fail();

  Backend* const first_;   // Not owned.
  Backend* const second_;  // Not owned.
  const int max_batch_;
  const int micro_batches_;
  DeviceThreads threads_;
  // Stage 0, on first_: the weights and gradients of W1..b2, the batch's images and labels.
  std::unique_ptr<DeviceBuffer> params0_, grads0_, micro_grads0_, x_, labels0_;
  std::unique_ptr<LeNetFeatures> features_;
  // Stage 1, on second_: W3..b4, the features coming in and their gradient going back, labels.
  std::unique_ptr<DeviceBuffer> params1_, grads1_, micro_grads1_, in_, din_, labels1_, loss_totals_;
  std::unique_ptr<LeNetHead> head_;
  // Host memory between them (the first device's pinned memory): features, labels, gradients.
  std::unique_ptr<DeviceBuffer> features_host_, labels_host_, dfeatures_host_;
  absl::Mutex mu_;
  int forwarded_ ABSL_GUARDED_BY(mu_) = 0;  // micro-batches stage 1 may take
  int returned_ ABSL_GUARDED_BY(mu_) = 0;   // micro-batches whose gradient stage 0 may take
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  Timing timing_;
};

// NewModel's counterpart for --model_parallel=2: model `name` split across two devices.
// INVALID_ARGUMENT for a model that cannot be split (only lenet can).
absl::StatusOr<std::unique_ptr<Model>> NewPipelinedModel(const std::string& name, Backend* first, Backend* second,
                                                         int max_batch, int micro_batches);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_MODELS_PIPELINE_H_
