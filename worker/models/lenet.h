// LeNet exactly as the seed: conv 3x3 (20) -> ReLU -> avgpool 2 -> conv 5x5 (50) -> ReLU ->
// avgpool 2 -> flatten (800) -> linear 128 -> ReLU -> linear 10, on 1x28x28 images.
// One Model (model.h): parameters and gradients in flat device buffers in Specs() order.
// Owns its device buffers; the backend is not owned. Not thread-safe.
#ifndef SUMMA_WORKER_MODELS_LENET_H_
#define SUMMA_WORKER_MODELS_LENET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/compute/backend.h"
#include "worker/models/model.h"

namespace summa::worker {

// LeNet's layers (Model::layers()), in forward order, as its halves report them to LayerHooks.
enum LeNetLayer : int { kLeNetConv1, kLeNetConv2, kLeNetLinear3, kLeNetLinear4, kLeNetLayers };

// LeNet's two halves, each on one backend with activations for `capacity` examples kept from a
// forward pass to its backward pass (rows [at, at + n) of them), and scratch for passes of up
// to `max_pass` examples. LeNet runs both on one device; PipelinedLeNet (pipeline.h) runs them
// on two, the seed's model parallelism. Not thread-safe; the backend is not owned.
//
// The features: conv 3x3 -> ReLU -> avgpool -> conv 5x5 -> ReLU -> avgpool, parameters W1 b1 W2
// b2 (the first kParams floats of LeNet's flat buffer), kOut floats out per example.
class LeNetFeatures {
 public:
  static constexpr int64_t kParams = 20 * 9 + 20 + 50 * 20 * 25 + 50;
  static constexpr int kOut = 800;
  static absl::StatusOr<std::unique_ptr<LeNetFeatures>> Create(Backend* backend, int capacity, int max_pass);

  // x: n images (on the device) -> out(at) .. out(at + n). `hooks` (or null) hears of
  // kLeNetConv1 and kLeNetConv2, here and in Backward.
  absl::Status Forward(const float* x, int at, int n, const float* params, LayerHooks* hooks = nullptr);
  // From dout(at) (the loss's gradient at the output rows, filled by the caller) to the
  // parameters' gradient in `grads` (overwritten). `x` as given to Forward. `columns_ready`: the
  // last call of this object was the Forward of these same rows (its workspace is reused).
  absl::Status Backward(const float* x, int at, int n, const float* params, float* grads, bool columns_ready,
                        LayerHooks* hooks = nullptr);
  float* out(int at) { return p2_->data() + int64_t{at} * kOut; }
  float* dout(int at) { return dp2_->data() + int64_t{at} * kOut; }

 private:
  explicit LeNetFeatures(Backend* backend) : backend_(backend) {}
  Backend* const backend_;
  std::unique_ptr<DeviceBuffer> c1_, p1_, c2_, p2_, dp2_;  // capacity rows
  std::unique_ptr<DeviceBuffer> dc2_, dp1_, dc1_, workspace_;  // one pass
};

// The head: linear 800 -> 128 -> ReLU -> linear 10 -> softmax cross-entropy, parameters W3 b3
// W4 b4 (LeNet's flat buffer from LeNetFeatures::kParams on).
class LeNetHead {
 public:
  static constexpr int64_t kParams = 800 * 128 + 128 + 128 * 10 + 10;
  static absl::StatusOr<std::unique_ptr<LeNetHead>> Create(Backend* backend, int capacity, int max_pass);

  // in: the features of rows [at, at + n) -> the logits of those rows. `hooks` (or null) hears
  // of kLeNetLinear3 and kLeNetLinear4, here and in Backward.
  absl::Status Forward(const float* in, int at, int n, const float* params, LayerHooks* hooks = nullptr);
  // The summed loss of rows [at, at + n) against `labels` (n, on the device) is added to
  // `loss_totals`; its gradient goes to `grads` (overwritten) and to `din` (n x 800).
  absl::Status Backward(const float* in, const float* labels, int at, int n, const float* params, float* din,
                        float* grads, float* loss_totals, LayerHooks* hooks = nullptr);
  absl::StatusOr<int64_t> CountCorrect(const float* labels, int at, int n);

 private:
  explicit LeNetHead(Backend* backend) : backend_(backend) {}
  Backend* const backend_;
  std::unique_ptr<DeviceBuffer> h3_, logits_;  // capacity rows
  std::unique_ptr<DeviceBuffer> dlogits_, dh3_;  // one pass
};

class LeNet final : public Model, private ChunkPasses {
 public:
  static constexpr char kName[] = "lenet";
  static constexpr int kClasses = 10;
  static constexpr int kImageSide = 28;
  static constexpr int kImageFloats = kImageSide * kImageSide;

  // W1 [20,1,3,3], b1 [20], W2 [50,20,5,5], b2 [50], W3 [800,128], b3 [128], W4 [128,10], b4 [10].
  static std::vector<TensorSpec> Specs();
  // Each LeNetLayer's weights and biases: {W1 b1}, {W2 b2}, {W3 b3}, {W4 b4}.
  static absl::Span<const LayerRange> Layers();
  static int64_t NumParams();
  // Weights drawn from N(0, 0.01^2) with `seed`, biases zero; flat, in Specs() order.
  static std::vector<float> SeedWeights(uint64_t seed);

  // Allocates every buffer for batches of up to `max_batch` examples once. A batch runs through
  // the network in chunks of `chunk` examples (0: the whole batch at once), their gradients
  // summed: on a CPU, chunks whose activations fit in cache run several times faster than one
  // pass over the whole batch. `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<LeNet>> Create(Backend* backend, int max_batch,
                                                       int chunk = 0);

  // Model:
  std::string name() const override { return kName; }
  std::vector<TensorSpec> specs() const override { return Specs(); }
  int64_t num_params() const override { return NumParams(); }
  std::vector<float> InitialWeights(uint64_t seed) const override { return SeedWeights(seed); }
  int image_floats() const override { return kImageFloats; }
  int classes() const override { return kClasses; }
  int max_batch() const override { return max_batch_; }
  absl::Status SetWeights(const float* host_flat) override;
  absl::Status ComputeGradients(const Examples& examples, int n) override;
  std::vector<LayerRange> layers() const override { return {Layers().begin(), Layers().end()}; }
  absl::Status ComputeGradientsPerLayer(const Examples& examples, int n, LayerHooks& hooks) override;
  absl::StatusOr<double> TakeLoss() override;
  absl::Status GetGradients(float* host_flat) override;
  absl::StatusOr<int64_t> CountCorrect(const float* images, const float* labels, int n) override;
  DeviceBuffer* weights() override { return params_.get(); }
  DeviceBuffer* gradients() override { return grads_.get(); }

 private:
  LeNet(Backend* backend, int max_batch, int chunk)
      : backend_(backend), max_batch_(max_batch), chunk_(chunk) {}
  // ChunkPasses, for n <= chunk_ examples; logits land in logits_.
  absl::Status Forward(const Examples& examples, int n, LayerHooks* hooks) override;
  absl::Status Backward(int n, DeviceBuffer& grads, LayerHooks* hooks) override;
  absl::StatusOr<int64_t> CountLastCorrect(int n) override;
  Backend* const backend_;  // Not owned.
  const int max_batch_;
  const int chunk_;  // examples per pass through the network
  std::unique_ptr<DeviceBuffer> params_, grads_, chunk_grads_;
  std::unique_ptr<DeviceBuffer> loss_totals_;  // Backend::SoftmaxCrossEntropy's totals
  std::unique_ptr<DeviceBuffer> x_, labels_;
  std::unique_ptr<LeNetFeatures> features_;
  std::unique_ptr<LeNetHead> head_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_MODELS_LENET_H_
