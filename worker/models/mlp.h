// The d2l multilayer perceptron: flatten (784) -> linear 256 -> ReLU -> linear 10, on 1x28x28
// images; weights drawn from N(0, 0.01^2), biases zero. One Model (model.h): parameters and
// gradients in flat device buffers in Specs() order.
// Owns its device buffers; the backend is not owned. Not thread-safe.
#ifndef SUMMA_WORKER_MODELS_MLP_H_
#define SUMMA_WORKER_MODELS_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/compute/backend.h"
#include "worker/models/model.h"

namespace summa::worker {

class Mlp final : public Model, private ChunkPasses {
 public:
  static constexpr char kName[] = "mlp";
  static constexpr int kClasses = 10;
  static constexpr int kImageFloats = 28 * 28;
  static constexpr int kHidden = 256;

  // W1 [784,256], b1 [256], W2 [256,10], b2 [10].
  static std::vector<TensorSpec> Specs();
  // Its two layers' weights and biases: {W1 b1}, {W2 b2}.
  static absl::Span<const LayerRange> Layers();
  static int64_t NumParams();
  // Weights drawn from N(0, 0.01^2) with `seed`, biases zero; flat, in Specs() order.
  static std::vector<float> SeedWeights(uint64_t seed);

  // As LeNet::Create: every buffer for batches of up to `max_batch` allocated once, passes of
  // `chunk` examples (0: the whole batch). `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(Backend* backend, int max_batch, int chunk = 0);

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
  Mlp(Backend* backend, int max_batch, int chunk)
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
  std::unique_ptr<DeviceBuffer> x_, labels_, h1_, logits_, dlogits_, dh1_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_MODELS_MLP_H_
