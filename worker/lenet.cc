#include "worker/lenet.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {
namespace {

enum Tensor { kW1, kB1, kW2, kB2, kW3, kB3, kW4, kB4 };
constexpr int kC1 = 20, kC2 = 50, kHidden = 128, kFlat = 800;

ConvShape Conv1(int n) { return {n, 1, 28, 28, kC1, 3}; }  // -> 26x26, pool -> 13x13
ConvShape Conv2(int n) { return {n, kC1, 13, 13, kC2, 5}; }  // -> 9x9, pool -> 4x4

}  // namespace

std::vector<TensorSpec> LeNet::Specs() {
  return {{"W1", DType::kFloat32, {kC1, 1, 3, 3}},   {"b1", DType::kFloat32, {kC1}},
          {"W2", DType::kFloat32, {kC2, kC1, 5, 5}}, {"b2", DType::kFloat32, {kC2}},
          {"W3", DType::kFloat32, {kFlat, kHidden}}, {"b3", DType::kFloat32, {kHidden}},
          {"W4", DType::kFloat32, {kHidden, kClasses}}, {"b4", DType::kFloat32, {kClasses}}};
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
  int64_t offset = 0;
  for (const TensorSpec& s : Specs()) {
    net->offsets_.push_back(offset);
    offset += s.num_elements();
  }
  const int64_t b = chunk;
  const std::pair<std::unique_ptr<DeviceBuffer>*, int64_t> buffers[] = {
      {&net->params_, NumParams()},
      {&net->loss_totals_, 2},
      {&net->grads_, NumParams()},
      {&net->chunk_grads_, chunk < max_batch ? NumParams() : 0},
      {&net->x_, b * kImageFloats},
      {&net->labels_, b},
      {&net->c1_, b * kC1 * 26 * 26},
      {&net->p1_, b * kC1 * 13 * 13},
      {&net->c2_, b * kC2 * 9 * 9},
      {&net->p2_, b * kFlat},
      {&net->h3_, b * kHidden},
      {&net->logits_, b * kClasses},
      {&net->dlogits_, b * kClasses},
      {&net->dh3_, b * kHidden},
      {&net->dp2_, b * kFlat},
      {&net->dc2_, b * kC2 * 9 * 9},
      {&net->dp1_, b * kC1 * 13 * 13},
      {&net->dc1_, b * kC1 * 26 * 26},
      {&net->workspace_, std::max(Conv1(chunk).workspace_floats(), Conv2(chunk).workspace_floats())},
  };
  for (const auto& [slot, floats] : buffers) {
    SUMMA_ASSIGN_OR_RETURN(*slot, backend->Alloc(floats));
  }
  return net;
}

float* LeNet::W(DeviceBuffer& buf, int tensor) const {
  return buf.data() + offsets_[tensor];
}

absl::Status LeNet::SetWeights(const float* host_flat) {
  return backend_->Upload(host_flat, NumParams(), params_->data());
}

absl::Status LeNet::GetGradients(float* host_flat) {
  return backend_->Download(grads_->data(), NumParams(), host_flat);
}

absl::Status LeNet::Forward(const Examples& examples, int n) {
  Backend& be = *backend_;
  SUMMA_RETURN_IF_ERROR(LoadExamples(be, examples, n, kImageFloats, x_->data(), labels_->data()));
  SUMMA_RETURN_IF_ERROR(be.Conv2dForward(Conv1(n), x_->data(), W(*params_, kW1), W(*params_, kB1),
                                         c1_->data(), workspace_->data()));
  SUMMA_RETURN_IF_ERROR(be.ReluForward(c1_->data(), c1_->data(), int64_t{n} * kC1 * 26 * 26));
  SUMMA_RETURN_IF_ERROR(be.AvgPool2Forward(c1_->data(), p1_->data(), n * kC1, 26, 26));
  SUMMA_RETURN_IF_ERROR(be.Conv2dForward(Conv2(n), p1_->data(), W(*params_, kW2), W(*params_, kB2),
                                         c2_->data(), workspace_->data()));
  SUMMA_RETURN_IF_ERROR(be.ReluForward(c2_->data(), c2_->data(), int64_t{n} * kC2 * 9 * 9));
  SUMMA_RETURN_IF_ERROR(be.AvgPool2Forward(c2_->data(), p2_->data(), n * kC2, 9, 9));
  SUMMA_RETURN_IF_ERROR(be.LinearForward(p2_->data(), W(*params_, kW3), W(*params_, kB3),
                                         h3_->data(), n, kFlat, kHidden));
  SUMMA_RETURN_IF_ERROR(be.ReluForward(h3_->data(), h3_->data(), int64_t{n} * kHidden));
  return be.LinearForward(h3_->data(), W(*params_, kW4), W(*params_, kB4), logits_->data(), n,
                          kHidden, kClasses);
}

absl::Status LeNet::Backward(int n, DeviceBuffer& grads) {
  Backend& be = *backend_;
  SUMMA_RETURN_IF_ERROR(be.SoftmaxCrossEntropy(logits_->data(), labels_->data(), dlogits_->data(),
                                             n, kClasses, loss_totals_->data()));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(h3_->data(), W(*params_, kW4), dlogits_->data(),
                                          dh3_->data(), W(grads, kW4), W(grads, kB4), n, kHidden,
                                          kClasses));
  SUMMA_RETURN_IF_ERROR(be.ReluBackward(h3_->data(), dh3_->data(), dh3_->data(), int64_t{n} * kHidden));
  SUMMA_RETURN_IF_ERROR(be.LinearBackward(p2_->data(), W(*params_, kW3), dh3_->data(), dp2_->data(),
                                          W(grads, kW3), W(grads, kB3), n, kFlat, kHidden));
  SUMMA_RETURN_IF_ERROR(be.AvgPool2Backward(dp2_->data(), dc2_->data(), n * kC2, 9, 9));
  SUMMA_RETURN_IF_ERROR(be.ReluBackward(c2_->data(), dc2_->data(), dc2_->data(), int64_t{n} * kC2 * 9 * 9));
  SUMMA_RETURN_IF_ERROR(be.Conv2dBackward(Conv2(n), p1_->data(), W(*params_, kW2), dc2_->data(),
                                          dp1_->data(), W(grads, kW2), W(grads, kB2),
                                          workspace_->data(), /*columns_ready=*/true));
  SUMMA_RETURN_IF_ERROR(be.AvgPool2Backward(dp1_->data(), dc1_->data(), n * kC1, 26, 26));
  SUMMA_RETURN_IF_ERROR(be.ReluBackward(c1_->data(), dc1_->data(), dc1_->data(), int64_t{n} * kC1 * 26 * 26));
  SUMMA_RETURN_IF_ERROR(be.Conv2dBackward(Conv1(n), x_->data(), W(*params_, kW1), dc1_->data(),
                                          /*dx=*/nullptr, W(grads, kW1), W(grads, kB1),
                                          workspace_->data(), /*columns_ready=*/false));
  return absl::OkStatus();
}

absl::Status LeNet::ComputeGradients(const Examples& examples, int n) {
  return ChunkedGradients(*backend_, {max_batch_, chunk_, kImageFloats}, *this, examples, n, *grads_,
                          *chunk_grads_);
}

absl::StatusOr<double> LeNet::TakeLoss() { return TakeLossTotals(*backend_, *loss_totals_, kClasses); }

absl::StatusOr<int64_t> LeNet::CountCorrect(const float* images, const float* labels, int n) {
  return ChunkedCountCorrect({max_batch_, chunk_, kImageFloats}, *this, images, labels, n);
}

absl::StatusOr<int64_t> LeNet::CountLastCorrect(int n) {
  return backend_->CountCorrect(logits_->data(), labels_->data(), n, kClasses);
}

}  // namespace summa::worker
