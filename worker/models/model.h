// Model: one network the worker trains, on one Backend. Parameters live in one flat device buffer
// in specs() order (the order the server partitions), gradients in another of the same layout, so
// that a push is one copy of that buffer. Inputs are single-channel square images of
// image_floats() floats each and class labels in [0, classes()).
//
// Implementations (LeNet, Mlp) own their device buffers and borrow the backend. Not thread-safe.
// The factory functions below are thread-safe.
#ifndef SUMMA_WORKER_MODELS_MODEL_H_
#define SUMMA_WORKER_MODELS_MODEL_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "worker/compute/backend.h"

namespace summa::worker {

// Where a batch's examples come from, for Model::ComputeGradients.
// - Host(images, labels): host arrays of the batch itself (images [n, image_floats()], labels
//   [n] as floats), copied to the device by each pass.
// - Resident(image_table, label_table, rows): tables already on the model's device (a whole
//   training set, uploaded once) and `rows`, the batch's row indices into them (device memory,
//   indices stored as floats): gathered on the device, nothing copied from the host per step.
struct Examples {
  const float* images = nullptr;
  const float* labels = nullptr;
  const float* rows = nullptr;  // null for Host

  static Examples Host(const float* images, const float* labels) { return {images, labels, nullptr}; }
  static Examples Resident(const float* image_table, const float* label_table, const float* rows) {
    return {image_table, label_table, rows};
  }
  // The examples from the `begin`-th on.
  Examples From(int begin, int image_floats) const {
    if (rows != nullptr) return {images, labels, rows + begin};
    return {images + int64_t{begin} * image_floats, labels + begin, nullptr};
  }
};

// One layer's run of a model's flat buffers (its weights and biases), in floats.
struct LayerRange {
  int64_t offset = 0;
  int64_t length = 0;
};

// What Model::ComputeGradientsPerLayer tells its caller as its passes reach each layer
// (Model::layers()), on the calling thread: what lets a trainer overlap a step's exchange with
// its compute. An error from a hook ends the computation with that error.
class LayerHooks {
 public:
  // Layer `layer`'s weights are about to be read for the first time: they must be in weights()
  // when the hook returns (it may write them there now).
  virtual absl::Status BeforeForward(int layer) = 0;
  // Layer `layer`'s gradients in gradients() are final: nothing of this computation writes them
  // again.
  virtual absl::Status GradientReady(int layer) = 0;

 protected:
  ~LayerHooks() = default;
};
// hooks->BeforeForward(layer) and hooks->GradientReady(layer), or OK when `hooks` is null: how
// the passes call them, at the cost of a comparison where nobody listens.
inline absl::Status HookBeforeForward(LayerHooks* hooks, int layer) {
  return hooks == nullptr ? absl::OkStatus() : hooks->BeforeForward(layer);
}
inline absl::Status HookGradientReady(LayerHooks* hooks, int layer) {
  return hooks == nullptr ? absl::OkStatus() : hooks->GradientReady(layer);
}

class Model {
 public:
  virtual ~Model() = default;

  // The --model name: "lenet", "mlp".
  virtual std::string name() const = 0;
  virtual std::vector<TensorSpec> specs() const = 0;
  virtual int64_t num_params() const = 0;
  // The model's seeded initial weights, flat in specs() order.
  virtual std::vector<float> InitialWeights(uint64_t seed) const = 0;
  virtual int image_floats() const = 0;
  virtual int classes() const = 0;
  // The most examples one call below may take.
  virtual int max_batch() const = 0;

  // Uploads host weights (flat, specs() order).
  virtual absl::Status SetWeights(const float* host_flat) = 0;
  // Forward and backward on n <= max_batch() examples. The gradient of the *summed* loss lands
  // in gradients(); the summed loss is added to a total on the device that TakeLoss reads. Waits
  // for nothing on the device (GetGradients does). n = 0 gives zero gradients.
  virtual absl::Status ComputeGradients(const Examples& examples, int n) = 0;
  // The layers' runs of the flat buffers, in forward order, end to end from 0 to num_params().
  virtual std::vector<LayerRange> layers() const { return {{0, num_params()}}; }
  // ComputeGradients (the same gradients, bit for bit) telling `hooks` of each layer as the
  // passes reach it: BeforeForward of every layer, first to last, each before that layer's
  // weights are first read, then GradientReady of every layer, last to first, each as soon as
  // its gradients are final; each exactly once, also for n = 0. The default (a model that
  // cannot tell): every BeforeForward, ComputeGradients, then every GradientReady.
  virtual absl::Status ComputeGradientsPerLayer(const Examples& examples, int n, LayerHooks& hooks);
  // The summed loss of every ComputeGradients since the last TakeLoss, which starts the total
  // again at zero. Waits for the device. INVALID_ARGUMENT if any of those examples had a label
  // outside [0, classes()) (its loss and gradient counted as zero).
  virtual absl::StatusOr<double> TakeLoss() = 0;
  // Downloads gradients() to host memory (flat, specs() order).
  virtual absl::Status GetGradients(float* host_flat) = 0;
  // How many of n <= max_batch() examples the model classifies right.
  virtual absl::StatusOr<int64_t> CountCorrect(const float* images, const float* labels, int n) = 0;

  // The flat device buffers, num_params() floats each; null for a model split across devices
  // (PipelinedLeNet), which holds each device's share in buffers of its own.
  virtual DeviceBuffer* weights() = 0;
  virtual DeviceBuffer* gradients() = 0;
};

// ComputeGradients on host arrays, then TakeLoss: one batch's summed loss (for tests and tools).
absl::StatusOr<double> GradientsAndLoss(Model& model, const float* images, const float* labels, int n);

// The names NewModel knows, in the order a help text lists them.
const std::vector<std::string>& ModelNames();

// Model `name` on `backend` (not owned; it must outlive the model), with every buffer for
// batches of up to `max_batch` examples allocated once. A batch runs through the network in
// chunks of `chunk` examples (0: the whole batch at once). INVALID_ARGUMENT, listing the choices,
// for a name not in ModelNames().
absl::StatusOr<std::unique_ptr<Model>> NewModel(const std::string& name, Backend* backend,
                                                int max_batch, int chunk = 0);

// Model `name`'s tensors without a device; the same error as NewModel for an unknown name.
absl::StatusOr<std::vector<TensorSpec>> ModelSpecs(const std::string& name);

// The chunk loop every implementation shares runs these passes of a model, n <= its chunk each.
class ChunkPasses {
 public:
  // Forward of n examples; logits stay on the device. HookBeforeForward(hooks, layer) before
  // each layer reads its weights (hooks may be null).
  virtual absl::Status Forward(const Examples& examples, int n, LayerHooks* hooks) = 0;
  // Backward of the last forward's n examples: the summed loss's gradient overwrites `grads`;
  // the summed loss is added to the model's total on the device. HookGradientReady(hooks, layer)
  // as soon as each layer's gradient in `grads` is written.
  virtual absl::Status Backward(int n, DeviceBuffer& grads, LayerHooks* hooks) = 0;
  // How many of the last forward's n examples are classified right.
  virtual absl::StatusOr<int64_t> CountLastCorrect(int n) = 0;

 protected:
  ~ChunkPasses() = default;
};
struct ChunkShape {
  int max_batch = 0;
  int chunk = 0;  // examples per pass; the whole batch when it is not smaller
  int image_floats = 0;
  absl::Span<const LayerRange> layers;  // Model::layers(), for ChunkedGradients' hooks
};
// OK for a batch of 0 to max_batch examples; else INVALID_ARGUMENT saying which bound it broke.
absl::Status CheckBatch(int n, int max_batch);
// Model::ComputeGradients over chunks: each chunk's gradient lands in `chunk_grads` and is summed
// into `grads` (one pass straight into `grads` when the batch fits one chunk). With `hooks`
// (ComputeGradientsPerLayer): the first chunk's forward calls BeforeForward, and the last
// chunk's backward sums each layer into `grads` as it is done, then calls GradientReady.
absl::Status ChunkedGradients(Backend& backend, const ChunkShape& shape, ChunkPasses& passes,
                              const Examples& examples, int n, DeviceBuffer& grads,
                              DeviceBuffer& chunk_grads, LayerHooks* hooks = nullptr);
// Model::CountCorrect over chunks.
absl::StatusOr<int64_t> ChunkedCountCorrect(const ChunkShape& shape, ChunkPasses& passes,
                                            const float* images, const float* labels, int n);

// For implementations' Forward: n examples' images into `x` [n, image_floats] and labels into
// `labels` [n] on the device (uploaded from host arrays, or gathered from resident tables).
absl::Status LoadExamples(Backend& backend, const Examples& examples, int n, int image_floats,
                          float* x, float* labels);
// For implementations' TakeLoss: reads and zeroes `totals` (Backend::SoftmaxCrossEntropy's two
// floats).
absl::StatusOr<double> TakeLossTotals(Backend& backend, DeviceBuffer& totals, int classes);

// For implementations' Create: allocates each buffer, of the given number of floats, on `backend`.
absl::Status AllocBuffers(Backend& backend,
                          std::initializer_list<std::pair<std::unique_ptr<DeviceBuffer>*, int64_t>> buffers);

// Helpers for implementations: how many floats `specs` hold, and the seed's initialisation:
// weights drawn from N(0, stddev^2) with `seed` in specs order, biases (names starting with 'b')
// zero and drawing nothing.
int64_t CountParams(const std::vector<TensorSpec>& specs);
std::vector<float> NormalWeights(const std::vector<TensorSpec>& specs, uint64_t seed, float stddev);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_MODELS_MODEL_H_
