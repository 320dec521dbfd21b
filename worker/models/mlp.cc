#include "worker/models/mlp.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {
namespace {

// Offsets of the tensors in the flat buffers.
constexpr int64_t kW1 = 0;
constexpr int64_t kB1 = kW1 + int64_t{Mlp::kImageFloats} * Mlp::kHidden;
constexpr int64_t kW2 = kB1 + Mlp::kHidden;
constexpr int64_t kB2 = kW2 + int64_t{Mlp::kHidden} * Mlp::kClasses;
constexpr int64_t kParams = kB2 + Mlp::kClasses;

}  // namespace

std::vector<TensorSpec> Mlp::Specs() {
  return {{"W1", DType::kFloat32, {kImageFloats, kHidden}},
          {"b1", DType::kFloat32, {kHidden}},
          {"W2", DType::kFloat32, {kHidden, kClasses}},
          {"b2", DType::kFloat32, {kClasses}}};
}

absl::Span<const LayerRange> Mlp::Layers() {
  static constexpr LayerRange kLayers[] = {{kW1, kW2 - kW1}, {kW2, kParams - kW2}};
  return kLayers;
}

int64_t Mlp::NumParams() { return kParams; }

std::vector<float> Mlp::SeedWeights(uint64_t seed) { return NormalWeights(Specs(), seed, 0.01f); }

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Backend* backend, int max_batch, int chunk) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be at least 1, got ", max_batch));
  }
  if (chunk < 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " is negative"));
  chunk = chunk == 0 ? max_batch : std::min(chunk, max_batch);
  std::unique_ptr<Mlp> net(new Mlp(backend, max_batch, chunk));
  const int64_t b = chunk;
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*backend, {{&net->params_, kParams},
                                                {&net->loss_totals_, 2},
                                                {&net->grads_, kParams},
                                                {&net->chunk_grads_, chunk < max_batch ? kParams : 0},
                                                {&net->x_, b * kImageFloats},
                                                {&net->labels_, b},
                                                {&net->h1_, b * kHidden},
                                                {&net->logits_, b * kClasses},
                                                {&net->dlogits_, b * kClasses},
                                                {&net->dh1_, b * kHidden}}));
  return net;
}

absl::Status Mlp::SetWeights(const float* host_flat) {
  return backend_->Upload(host_flat, kParams, params_->data());
}

absl::Status Mlp::GetGradients(float* host_flat) {
  return backend_->Download(grads_->data(), kParams, host_flat);
}

absl::Status Mlp::Forward(const Examples& examples, int n, LayerHooks* hooks) {
  Backend& be = *backend_;
  const float* w = params_->data();
  SUMMA_RETURN_IF_ERROR(LoadExamples(be, examples, n, kImageFloats, x_->data(), labels_->data()));
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, 0));
  SUMMA_RETURN_IF_ERROR(be.LinearForward(x_->data(), w + kW1, w + kB1, h1_->data(), n,
                                         kImageFloats, kHidden));
  SUMMA_RETURN_IF_ERROR(be.ReluForward(h1_->data(), h1_->data(), int64_t{n} * kHidden));
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, 1));
  return be.LinearForward(h1_->data(), w + kW2, w + kB2, logits_->data(), n, kHidden, kClasses);
}

absl::Status Mlp::Backward(int n, DeviceBuffer& grads, LayerHooks* hooks) {
  Backend& be = *backend_;
  const float* w = params_->data();
  float* g = grads.data();
  SUMMA_RETURN_IF_ERROR(be.SoftmaxCrossEntropy(logits_->data(), labels_->data(), dlogits_->data(),
                                             n, kClasses, loss_totals_->data()));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(h1_->data(), w + kW2, dlogits_->data(), dh1_->data(),
                                          g + kW2, g + kB2, n, kHidden, kClasses));
  SUMMA_RETURN_IF_ERROR(HookGradientReady(hooks, 1));
  SUMMA_RETURN_IF_ERROR(be.ReluBackward(h1_->data(), dh1_->data(), dh1_->data(), int64_t{n} * kHidden));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(x_->data(), w + kW1, dh1_->data(), /*dx=*/nullptr,
                                          g + kW1, g + kB1, n, kImageFloats, kHidden));
  return HookGradientReady(hooks, 0);
}

absl::Status Mlp::ComputeGradients(const Examples& examples, int n) {
  return ChunkedGradients(*backend_, {max_batch_, chunk_, kImageFloats, {}}, *this, examples, n, *grads_,
                          *chunk_grads_);
}

absl::Status Mlp::ComputeGradientsPerLayer(const Examples& examples, int n, LayerHooks& hooks) {
  return ChunkedGradients(*backend_, {max_batch_, chunk_, kImageFloats, Layers()}, *this, examples, n, *grads_,
                          *chunk_grads_, &hooks);
}

absl::StatusOr<double> Mlp::TakeLoss() { return TakeLossTotals(*backend_, *loss_totals_, kClasses); }

absl::StatusOr<int64_t> Mlp::CountCorrect(const float* images, const float* labels, int n) {
  return ChunkedCountCorrect({max_batch_, chunk_, kImageFloats, {}}, *this, images, labels, n);
}

absl::StatusOr<int64_t> Mlp::CountLastCorrect(int n) {
  return backend_->CountCorrect(logits_->data(), labels_->data(), n, kClasses);
}

}  // namespace summa::worker
