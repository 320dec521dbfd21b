#include "worker/models/lenet.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {
namespace {

constexpr int kC1 = 20, kC2 = 50, kHidden = 128, kFlat = LeNetFeatures::kOut;
// Where each tensor starts in its half's parameters (LeNet's flat buffer, the head's from
// LeNetFeatures::kParams on).
constexpr int64_t kW1 = 0, kB1 = kC1 * 9, kW2 = kB1 + kC1, kB2 = kW2 + kC2 * kC1 * 25;
constexpr int64_t kW3 = 0, kB3 = int64_t{kFlat} * kHidden, kW4 = kB3 + kHidden, kB4 = kW4 + kHidden * 10;
static_assert(kB2 + kC2 == LeNetFeatures::kParams);
static_assert(kB4 + 10 == LeNetHead::kParams);

ConvShape Conv1(int n) { return {n, 1, 28, 28, kC1, 3}; }  // -> 26x26, pool -> 13x13
ConvShape Conv2(int n) { return {n, kC1, 13, 13, kC2, 5}; }  // -> 9x9, pool -> 4x4

}  // namespace

absl::StatusOr<std::unique_ptr<LeNetFeatures>> LeNetFeatures::Create(Backend* backend, int capacity, int max_pass) {
  std::unique_ptr<LeNetFeatures> f(new LeNetFeatures(backend));
  const int64_t c = capacity, m = max_pass;
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*backend, {
      {&f->c1_, c * kC1 * 26 * 26}, {&f->p1_, c * kC1 * 13 * 13}, {&f->c2_, c * kC2 * 9 * 9},
      {&f->p2_, c * kFlat}, {&f->dp2_, c * kFlat},
      {&f->dc2_, m * kC2 * 9 * 9}, {&f->dp1_, m * kC1 * 13 * 13}, {&f->dc1_, m * kC1 * 26 * 26},
      {&f->workspace_, std::max(Conv1(max_pass).workspace_floats(), Conv2(max_pass).workspace_floats())}}));
  return f;
}

absl::Status LeNetFeatures::Forward(const float* x, int at, int n, const float* params, LayerHooks* hooks) {
  Backend& be = *backend_;
  float* const c1 = c1_->data() + int64_t{at} * kC1 * 26 * 26;
  float* const p1 = p1_->data() + int64_t{at} * kC1 * 13 * 13;
  float* const c2 = c2_->data() + int64_t{at} * kC2 * 9 * 9;
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, kLeNetConv1));
  SUMMA_RETURN_IF_ERROR(be.Conv2dReluPoolForward(Conv1(n), x, params + kW1, params + kB1, c1, p1, workspace_->data()));
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, kLeNetConv2));
  SUMMA_RETURN_IF_ERROR(be.Conv2dReluForward(Conv2(n), p1, params + kW2, params + kB2, c2, workspace_->data()));
  return be.AvgPool2Forward(c2, out(at), n * kC2, 9, 9);
}

absl::Status LeNetFeatures::Backward(const float* x, int at, int n, const float* params, float* grads,
                                     bool columns_ready, LayerHooks* hooks) {
  Backend& be = *backend_;
  const float* const c1 = c1_->data() + int64_t{at} * kC1 * 26 * 26;
  const float* const p1 = p1_->data() + int64_t{at} * kC1 * 13 * 13;
  const float* const c2 = c2_->data() + int64_t{at} * kC2 * 9 * 9;
  float* const dc2 = dc2_->data();
  float* const dp1 = dp1_->data();
  float* const dc1 = dc1_->data();
  SUMMA_RETURN_IF_ERROR(be.AvgPool2ReluBackward(c2, dout(at), dc2, n * kC2, 9, 9));
  SUMMA_RETURN_IF_ERROR(be.Conv2dBackward(Conv2(n), p1, params + kW2, dc2, dp1, grads + kW2, grads + kB2,
                                          workspace_->data(), columns_ready));
  SUMMA_RETURN_IF_ERROR(HookGradientReady(hooks, kLeNetConv2));
  SUMMA_RETURN_IF_ERROR(be.AvgPool2ReluBackward(c1, dp1, dc1, n * kC1, 26, 26));
  SUMMA_RETURN_IF_ERROR(be.Conv2dBackward(Conv1(n), x, params + kW1, dc1, /*dx=*/nullptr, grads + kW1, grads + kB1,
                                          workspace_->data(), /*columns_ready=*/false));
  return HookGradientReady(hooks, kLeNetConv1);
}

absl::StatusOr<std::unique_ptr<LeNetHead>> LeNetHead::Create(Backend* backend, int capacity, int max_pass) {
  std::unique_ptr<LeNetHead> h(new LeNetHead(backend));
  const int64_t c = capacity, m = max_pass;
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*backend, {{&h->h3_, c * kHidden}, {&h->logits_, c * LeNet::kClasses},
                                            {&h->dlogits_, m * LeNet::kClasses}, {&h->dh3_, m * kHidden}}));
  return h;
}

absl::Status LeNetHead::Forward(const float* in, int at, int n, const float* params, LayerHooks* hooks) {
  Backend& be = *backend_;
  float* const h3 = h3_->data() + int64_t{at} * kHidden;
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, kLeNetLinear3));
  SUMMA_RETURN_IF_ERROR(be.LinearForward(in, params + kW3, params + kB3, h3, n, kFlat, kHidden));
  SUMMA_RETURN_IF_ERROR(be.ReluForward(h3, h3, int64_t{n} * kHidden));
  SUMMA_RETURN_IF_ERROR(HookBeforeForward(hooks, kLeNetLinear4));
  return be.LinearForward(h3, params + kW4, params + kB4, logits_->data() + int64_t{at} * LeNet::kClasses, n,
                          kHidden, LeNet::kClasses);
}

absl::Status LeNetHead::Backward(const float* in, const float* labels, int at, int n, const float* params,
                                 float* din, float* grads, float* loss_totals, LayerHooks* hooks) {
  Backend& be = *backend_;
  const float* const h3 = h3_->data() + int64_t{at} * kHidden;
  float* const dlogits = dlogits_->data();
  float* const dh3 = dh3_->data();
  SUMMA_RETURN_IF_ERROR(be.SoftmaxCrossEntropy(logits_->data() + int64_t{at} * LeNet::kClasses, labels, dlogits,
                                               n, LeNet::kClasses, loss_totals));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(h3, params + kW4, dlogits, dh3, grads + kW4, grads + kB4, n, kHidden,
                                          LeNet::kClasses));
  SUMMA_RETURN_IF_ERROR(HookGradientReady(hooks, kLeNetLinear4));
  SUMMA_RETURN_IF_ERROR(be.ReluBackward(h3, dh3, dh3, int64_t{n} * kHidden));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(in, params + kW3, dh3, din, grads + kW3, grads + kB3, n, kFlat, kHidden));
  return HookGradientReady(hooks, kLeNetLinear3);
}

absl::StatusOr<int64_t> LeNetHead::CountCorrect(const float* labels, int at, int n) {
  return backend_->CountCorrect(logits_->data() + int64_t{at} * LeNet::kClasses, labels, n, LeNet::kClasses);
}

std::vector<TensorSpec> LeNet::Specs() {
  return {{"W1", DType::kFloat32, {kC1, 1, 3, 3}},   {"b1", DType::kFloat32, {kC1}},
          {"W2", DType::kFloat32, {kC2, kC1, 5, 5}}, {"b2", DType::kFloat32, {kC2}},
          {"W3", DType::kFloat32, {kFlat, kHidden}}, {"b3", DType::kFloat32, {kHidden}},
          {"W4", DType::kFloat32, {kHidden, kClasses}}, {"b4", DType::kFloat32, {kClasses}}};
}

absl::Span<const LayerRange> LeNet::Layers() {
  static constexpr int64_t kHead = LeNetFeatures::kParams;
  static constexpr LayerRange kLayers[kLeNetLayers] = {
      {kW1, kW2 - kW1}, {kW2, kHead - kW2}, {kHead + kW3, kW4 - kW3}, {kHead + kW4, LeNetHead::kParams - kW4}};
  return kLayers;
}

int64_t LeNet::NumParams() {
  static const int64_t n = CountParams(Specs());
  return n;
}

std::vector<float> LeNet::SeedWeights(uint64_t seed) { return NormalWeights(Specs(), seed, 0.01f); }

absl::StatusOr<std::unique_ptr<LeNet>> LeNet::Create(Backend* backend, int max_batch, int chunk) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be at least 1, got ", max_batch));
  }
  if (chunk < 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " is negative"));
  chunk = chunk == 0 ? max_batch : std::min(chunk, max_batch);
  std::unique_ptr<LeNet> net(new LeNet(backend, max_batch, chunk));
  const int64_t b = chunk;
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*backend, {{&net->params_, NumParams()},
                                            {&net->loss_totals_, 2},
                                            {&net->grads_, NumParams()},
                                            {&net->chunk_grads_, chunk < max_batch ? NumParams() : 0},
                                            {&net->x_, b * kImageFloats},
                                            {&net->labels_, b}}));
  SUMMA_ASSIGN_OR_RETURN(net->features_, LeNetFeatures::Create(backend, chunk, chunk));
  SUMMA_ASSIGN_OR_RETURN(net->head_, LeNetHead::Create(backend, chunk, chunk));
  return net;
}

absl::Status LeNet::SetWeights(const float* host_flat) {
  return backend_->Upload(host_flat, NumParams(), params_->data());
}

absl::Status LeNet::GetGradients(float* host_flat) {
  return backend_->Download(grads_->data(), NumParams(), host_flat);
}

absl::Status LeNet::Forward(const Examples& examples, int n, LayerHooks* hooks) {
  SUMMA_RETURN_IF_ERROR(LoadExamples(*backend_, examples, n, kImageFloats, x_->data(), labels_->data()));
  SUMMA_RETURN_IF_ERROR(features_->Forward(x_->data(), 0, n, params_->data(), hooks));
  return head_->Forward(features_->out(0), 0, n, params_->data() + LeNetFeatures::kParams, hooks);
}

absl::Status LeNet::Backward(int n, DeviceBuffer& grads, LayerHooks* hooks) {
  SUMMA_RETURN_IF_ERROR(head_->Backward(features_->out(0), labels_->data(), 0, n,
                                        params_->data() + LeNetFeatures::kParams, features_->dout(0),
                                        grads.data() + LeNetFeatures::kParams, loss_totals_->data(), hooks));
  return features_->Backward(x_->data(), 0, n, params_->data(), grads.data(), /*columns_ready=*/true, hooks);
}

absl::Status LeNet::ComputeGradients(const Examples& examples, int n) {
  return ChunkedGradients(*backend_, {max_batch_, chunk_, kImageFloats, {}}, *this, examples, n, *grads_,
                          *chunk_grads_);
}

absl::Status LeNet::ComputeGradientsPerLayer(const Examples& examples, int n, LayerHooks& hooks) {
  return ChunkedGradients(*backend_, {max_batch_, chunk_, kImageFloats, Layers()}, *this, examples, n, *grads_,
                          *chunk_grads_, &hooks);
}

absl::StatusOr<double> LeNet::TakeLoss() { return TakeLossTotals(*backend_, *loss_totals_, kClasses); }

absl::StatusOr<int64_t> LeNet::CountCorrect(const float* images, const float* labels, int n) {
  return ChunkedCountCorrect({max_batch_, chunk_, kImageFloats, {}}, *this, images, labels, n);
}

absl::StatusOr<int64_t> LeNet::CountLastCorrect(int n) { return head_->CountCorrect(labels_->data(), 0, n); }

}  // namespace summa::worker
