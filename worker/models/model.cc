#include "worker/models/model.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "absl/strings/str_join.h"
#include "worker/models/lenet.h"
#include "worker/models/mlp.h"

namespace summa::worker {
namespace {

absl::Status UnknownModel(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", name, "' (choose one of ",
                                                 absl::StrJoin(ModelNames(), ", "), ")"));
}

}  // namespace

const std::vector<std::string>& ModelNames() {
  static const std::vector<std::string> names = {LeNet::kName, Mlp::kName};
  return names;
}

absl::StatusOr<std::unique_ptr<Model>> NewModel(const std::string& name, Backend* backend,
                                                int max_batch, int chunk) {
  if (name == LeNet::kName) {
    absl::StatusOr<std::unique_ptr<LeNet>> net = LeNet::Create(backend, max_batch, chunk);
    if (!net.ok()) return net.status();
    return std::unique_ptr<Model>(std::move(*net));
  }
  if (name == Mlp::kName) {
    absl::StatusOr<std::unique_ptr<Mlp>> net = Mlp::Create(backend, max_batch, chunk);
    if (!net.ok()) return net.status();
    return std::unique_ptr<Model>(std::move(*net));
  }
  return UnknownModel(name);
}

absl::StatusOr<std::vector<TensorSpec>> ModelSpecs(const std::string& name) {
  if (name == LeNet::kName) return LeNet::Specs();
  if (name == Mlp::kName) return Mlp::Specs();
  return UnknownModel(name);
}

int64_t CountParams(const std::vector<TensorSpec>& specs) {
  int64_t n = 0;
  for (const TensorSpec& s : specs) n += s.num_elements();
  return n;
}

std::vector<float> NormalWeights(const std::vector<TensorSpec>& specs, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> flat;
  flat.reserve(CountParams(specs));
  for (const TensorSpec& s : specs) {
    const bool bias = s.name[0] == 'b';
    for (int64_t i = 0; i < s.num_elements(); ++i) flat.push_back(bias ? 0.0f : normal(rng));
  }
  return flat;
}

absl::Status CheckBatch(int n, int max_batch) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", n, " examples: the count must not be negative"));
  }
  if (n > max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", n, " examples exceeds the model's ", max_batch));
  }
  return absl::OkStatus();
}

namespace {

// The hooks of the last chunk's backward in a batch of several: each layer's gradient is summed
// into the batch's as soon as the pass has written it, and only then reported.
class SumThenReport final : public LayerHooks {
 public:
  SumThenReport(Backend& backend, absl::Span<const LayerRange> layers, DeviceBuffer& chunk_grads,
                DeviceBuffer& grads, LayerHooks& hooks)
      : backend_(backend), layers_(layers), chunk_grads_(chunk_grads), grads_(grads), hooks_(hooks),
        summed_(layers.size(), 0) {}

  absl::Status BeforeForward(int) override {
    return absl::InternalError("a backward pass asked for a layer's weights");
  }
  absl::Status GradientReady(int layer) override {
    if (layer < 0 || static_cast<size_t>(layer) >= layers_.size() || summed_[layer]) {
      return absl::InternalError(absl::StrCat("layer ", layer, " reported twice or out of range"));
    }
    const LayerRange& r = layers_[layer];
    SUMMA_RETURN_IF_ERROR(backend_.Axpy(1.0f, chunk_grads_.data() + r.offset, grads_.data() + r.offset, r.length));
    summed_[layer] = 1;
    return hooks_.GradientReady(layer);
  }
  // Every layer was summed (a pass that skipped one would lose that chunk's share).
  absl::Status CheckAll() const {
    for (size_t l = 0; l < summed_.size(); ++l) {
      if (!summed_[l]) return absl::InternalError(absl::StrCat("the backward pass never reported layer ", l));
    }
    return absl::OkStatus();
  }

 private:
  Backend& backend_;
  const absl::Span<const LayerRange> layers_;
  DeviceBuffer& chunk_grads_;
  DeviceBuffer& grads_;
  LayerHooks& hooks_;
  std::vector<char> summed_;
};

}  // namespace

absl::Status ChunkedGradients(Backend& backend, const ChunkShape& shape, ChunkPasses& passes,
                              const Examples& examples, int n, DeviceBuffer& grads,
                              DeviceBuffer& chunk_grads, LayerHooks* hooks) {
  SUMMA_RETURN_IF_ERROR(CheckBatch(n, shape.max_batch));
  const int layers = static_cast<int>(shape.layers.size());
  if (n == 0) {
    for (int l = 0; l < layers; ++l) SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, l));
    SUMMA_RETURN_IF_ERROR(backend.Zero(grads.data(), grads.size()));
    for (int l = layers - 1; l >= 0; --l) SUMMA_RETURN_IF_ERROR(HookGradientReady(hooks, l));
    return absl::OkStatus();
  }
  if (n <= shape.chunk) {
    SUMMA_RETURN_IF_ERROR(passes.Forward(examples, n, hooks));
    return passes.Backward(n, grads, hooks);
  }
  SUMMA_RETURN_IF_ERROR(backend.Zero(grads.data(), grads.size()));
  for (int begin = 0; begin < n; begin += shape.chunk) {
    const int m = std::min(shape.chunk, n - begin);
    SUMMA_RETURN_IF_ERROR(passes.Forward(examples.From(begin, shape.image_floats), m, begin == 0 ? hooks : nullptr));
    if (hooks != nullptr && begin + m == n) {
      SumThenReport last(backend, shape.layers, chunk_grads, grads, *hooks);
      SUMMA_RETURN_IF_ERROR(passes.Backward(m, chunk_grads, &last));
      return last.CheckAll();
    }
    SUMMA_RETURN_IF_ERROR(passes.Backward(m, chunk_grads, nullptr));
    SUMMA_RETURN_IF_ERROR(backend.Axpy(1.0f, chunk_grads.data(), grads.data(), grads.size()));
  }
  return absl::OkStatus();
}

absl::Status Model::ComputeGradientsPerLayer(const Examples& examples, int n, LayerHooks& hooks) {
  const int layers = static_cast<int>(this->layers().size());
  for (int l = 0; l < layers; ++l) SUMMA_RETURN_IF_ERROR(hooks.BeforeForward(l));
  SUMMA_RETURN_IF_ERROR(ComputeGradients(examples, n));
  for (int l = layers - 1; l >= 0; --l) SUMMA_RETURN_IF_ERROR(hooks.GradientReady(l));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ChunkedCountCorrect(const ChunkShape& shape, ChunkPasses& passes,
                                            const float* images, const float* labels, int n) {
  SUMMA_RETURN_IF_ERROR(CheckBatch(n, shape.max_batch));
  int64_t correct = 0;
  for (int begin = 0; begin < n; begin += shape.chunk) {
    const int m = std::min(shape.chunk, n - begin);
    SUMMA_RETURN_IF_ERROR(passes.Forward(Examples::Host(images, labels).From(begin, shape.image_floats), m, nullptr));
    SUMMA_ASSIGN_OR_RETURN(int64_t c, passes.CountLastCorrect(m));
    correct += c;
  }
  return correct;
}

absl::Status LoadExamples(Backend& backend, const Examples& examples, int n, int image_floats,
                          float* x, float* labels) {
  if (examples.rows != nullptr) {
    SUMMA_RETURN_IF_ERROR(backend.Gather(examples.images, image_floats, examples.rows, n, x));
    return backend.Gather(examples.labels, 1, examples.rows, n, labels);
  }
  SUMMA_RETURN_IF_ERROR(backend.Upload(examples.images, int64_t{n} * image_floats, x));
  return backend.Upload(examples.labels, n, labels);
}

absl::StatusOr<double> TakeLossTotals(Backend& backend, DeviceBuffer& totals, int classes) {
  float host[2];
  SUMMA_RETURN_IF_ERROR(backend.Download(totals.data(), 2, host));
  SUMMA_RETURN_IF_ERROR(backend.Zero(totals.data(), 2));
  if (host[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(host[1], " examples had a label outside 0..",
                                                   classes - 1));
  }
  return static_cast<double>(host[0]);
}

absl::StatusOr<double> GradientsAndLoss(Model& model, const float* images, const float* labels, int n) {
  SUMMA_RETURN_IF_ERROR(model.ComputeGradients(Examples::Host(images, labels), n));
  return model.TakeLoss();
}

absl::Status AllocBuffers(Backend& backend,
                          std::initializer_list<std::pair<std::unique_ptr<DeviceBuffer>*, int64_t>> buffers) {
  for (const auto& [slot, floats] : buffers) {
    SUMMA_ASSIGN_OR_RETURN(*slot, backend.Alloc(floats));
  }
  return absl::OkStatus();
}

}  // namespace summa::worker
