#include "worker/models/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {
namespace {

constexpr int64_t kOut = LeNetFeatures::kOut;
constexpr int kImage = LeNet::kImageFloats;

}  // namespace

absl::StatusOr<std::unique_ptr<PipelinedLeNet>> PipelinedLeNet::Create(Backend* first, Backend* second,
                                                                       int max_batch, int micro_batches) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be at least 1, got ", max_batch));
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batches must be at least 1, got ", micro_batches));
  }
  if (first == second) return absl::InvalidArgumentError("model parallelism needs two backends, got one twice");
  std::unique_ptr<PipelinedLeNet> p(new PipelinedLeNet(first, second, max_batch, micro_batches));
  const int64_t b = max_batch;
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*first, {{&p->params0_, LeNetFeatures::kParams},
                                              {&p->grads0_, LeNetFeatures::kParams},
                                              {&p->micro_grads0_, LeNetFeatures::kParams},
                                              {&p->x_, b * kImage},
                                              {&p->labels0_, b}}));
  SUMMA_RETURN_IF_ERROR(AllocBuffers(*second, {{&p->params1_, LeNetHead::kParams},
                                               {&p->grads1_, LeNetHead::kParams},
                                               {&p->micro_grads1_, LeNetHead::kParams},
                                               {&p->in_, b * kOut},
                                               {&p->din_, b * kOut},
                                               {&p->labels1_, b},
                                               {&p->loss_totals_, 2}}));
  SUMMA_ASSIGN_OR_RETURN(p->features_host_, first->AllocHost(b * kOut));
  SUMMA_ASSIGN_OR_RETURN(p->dfeatures_host_, first->AllocHost(b * kOut));
  SUMMA_ASSIGN_OR_RETURN(p->labels_host_, first->AllocHost(b));
  // Every micro-batch's activations are kept from its forward pass to its backward pass.
  SUMMA_ASSIGN_OR_RETURN(p->features_, LeNetFeatures::Create(first, max_batch, max_batch));
  SUMMA_ASSIGN_OR_RETURN(p->head_, LeNetHead::Create(second, max_batch, max_batch));
  return p;
}

absl::Status PipelinedLeNet::SetWeights(const float* host_flat) {
  SUMMA_RETURN_IF_ERROR(first_->Upload(host_flat, LeNetFeatures::kParams, params0_->data()));
  return second_->Upload(host_flat + LeNetFeatures::kParams, LeNetHead::kParams, params1_->data());
}

absl::Status PipelinedLeNet::GetGradients(float* host_flat) {
  SUMMA_RETURN_IF_ERROR(first_->Download(grads0_->data(), LeNetFeatures::kParams, host_flat));
  return second_->Download(grads1_->data(), LeNetHead::kParams, host_flat + LeNetFeatures::kParams);
}

absl::StatusOr<double> PipelinedLeNet::TakeLoss() {
  return TakeLossTotals(*second_, *loss_totals_, LeNet::kClasses);
}

absl::Status PipelinedLeNet::WaitFor(const int* counter, int i, absl::Duration* waited) {
  struct Ready {
    const int* counter;
    int i;
    const bool* failed;
    bool Check() const { return *counter > i || *failed; }
  };
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  const Ready ready{counter, i, &failed_};
  mu_.Await(absl::Condition(&ready, &Ready::Check));
  *waited += absl::Now() - start;
  if (*counter > i) return absl::OkStatus();
  return absl::AbortedError("the other pipeline stage failed");
}

void PipelinedLeNet::Hand(int* counter, int i) {
  absl::MutexLock lock(&mu_);
  *counter = i + 1;
}

void PipelinedLeNet::Fail() {
  absl::MutexLock lock(&mu_);
  failed_ = true;
}

absl::Status PipelinedLeNet::RunStage0(const Examples& examples, int n, int m) {
  Backend& be = *first_;
  const absl::Time start = absl::Now();
  absl::Duration waited;
  for (int i = 0; i < m; ++i) {
    const int b = Begin(i, n, m), k = Begin(i + 1, n, m) - b;
    SUMMA_RETURN_IF_ERROR(LoadExamples(be, examples.From(b, kImage), k, kImage, x_->data() + int64_t{b} * kImage,
                                       labels0_->data() + b));
    SUMMA_RETURN_IF_ERROR(features_->Forward(x_->data() + int64_t{b} * kImage, b, k, params0_->data()));
    SUMMA_RETURN_IF_ERROR(be.Download(features_->out(b), k * kOut, features_host_->data() + b * kOut));
    SUMMA_RETURN_IF_ERROR(be.Download(labels0_->data() + b, k, labels_host_->data() + b));
    Hand(&forwarded_, i);
  }
  for (int i = 0; i < m; ++i) {
    const int b = Begin(i, n, m), k = Begin(i + 1, n, m) - b;
    SUMMA_RETURN_IF_ERROR(WaitFor(&returned_, i, &waited));
    SUMMA_RETURN_IF_ERROR(be.Upload(dfeatures_host_->data() + b * kOut, k * kOut, features_->dout(b)));
    // Other micro-batches' forward passes ran since this one's: its workspace is gone.
    float* const grads = i == 0 ? grads0_->data() : micro_grads0_->data();
    SUMMA_RETURN_IF_ERROR(features_->Backward(x_->data() + int64_t{b} * kImage, b, k, params0_->data(), grads,
                                              /*columns_ready=*/m == 1));
    if (i > 0) SUMMA_RETURN_IF_ERROR(be.Axpy(1.0f, grads, grads0_->data(), LeNetFeatures::kParams));
  }
  timing_.stage[0] += absl::Now() - start - waited;
  return absl::OkStatus();
}

absl::Status PipelinedLeNet::RunStage1(int n, int m) {
  Backend& be = *second_;
  const absl::Time start = absl::Now();
  absl::Duration waited;
  for (int i = 0; i < m; ++i) {
    const int b = Begin(i, n, m), k = Begin(i + 1, n, m) - b;
    SUMMA_RETURN_IF_ERROR(WaitFor(&forwarded_, i, &waited));
    float* const in = in_->data() + b * kOut;
    float* const din = din_->data() + b * kOut;
    SUMMA_RETURN_IF_ERROR(be.Upload(features_host_->data() + b * kOut, k * kOut, in));
    SUMMA_RETURN_IF_ERROR(be.Upload(labels_host_->data() + b, k, labels1_->data() + b));
    SUMMA_RETURN_IF_ERROR(head_->Forward(in, b, k, params1_->data()));
    float* const grads = i == 0 ? grads1_->data() : micro_grads1_->data();
    SUMMA_RETURN_IF_ERROR(head_->Backward(in, labels1_->data() + b, b, k, params1_->data(), din, grads,
                                          loss_totals_->data()));
    if (i > 0) SUMMA_RETURN_IF_ERROR(be.Axpy(1.0f, grads, grads1_->data(), LeNetHead::kParams));
    SUMMA_RETURN_IF_ERROR(be.Download(din, k * kOut, dfeatures_host_->data() + b * kOut));
    Hand(&returned_, i);
  }
  timing_.stage[1] += absl::Now() - start - waited;
  return absl::OkStatus();
}

absl::Status PipelinedLeNet::ComputeGradients(const Examples& examples, int n) {
  SUMMA_RETURN_IF_ERROR(CheckBatch(n, max_batch_));
  if (n == 0) {
    SUMMA_RETURN_IF_ERROR(first_->Zero(grads0_->data(), LeNetFeatures::kParams));
    return second_->Zero(grads1_->data(), LeNetHead::kParams);
  }
  const absl::Time start = absl::Now();
  const int m = std::min(micro_batches_, n);
  {
    absl::MutexLock lock(&mu_);
    forwarded_ = returned_ = 0;
    failed_ = false;
  }
  absl::Status stages[2];
  SUMMA_RETURN_IF_ERROR(threads_.Run([&](int stage) {
    stages[stage] = stage == 0 ? RunStage0(examples, n, m) : RunStage1(n, m);
    if (!stages[stage].ok()) Fail();  // the other stage stops waiting for it
    return absl::OkStatus();
  }));
  // The stage that failed first says why; the other was only told to stop (ABORTED).
  for (const absl::Status& s : stages) {
    if (!s.ok() && !absl::IsAborted(s)) return s;
  }
  for (const absl::Status& s : stages) SUMMA_RETURN_IF_ERROR(s);
  timing_.steps += absl::Now() - start;
  ++timing_.count;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PipelinedLeNet::CountCorrect(const float* images, const float* labels, int n) {
  // Evaluation: one chunk at a time through both stages, from the calling thread.
  int64_t correct = 0;
  for (int b = 0; b < n; b += max_batch_) {
    const int k = std::min(max_batch_, n - b);
    SUMMA_RETURN_IF_ERROR(LoadExamples(*first_, Examples::Host(images + int64_t{b} * kImage, labels + b), k, kImage,
                                       x_->data(), labels0_->data()));
    SUMMA_RETURN_IF_ERROR(features_->Forward(x_->data(), 0, k, params0_->data()));
    SUMMA_RETURN_IF_ERROR(first_->Download(features_->out(0), k * kOut, features_host_->data()));
    SUMMA_RETURN_IF_ERROR(second_->Upload(features_host_->data(), k * kOut, in_->data()));
    SUMMA_RETURN_IF_ERROR(second_->Upload(labels + b, k, labels1_->data()));
    SUMMA_RETURN_IF_ERROR(head_->Forward(in_->data(), 0, k, params1_->data()));
    SUMMA_ASSIGN_OR_RETURN(const int64_t right, head_->CountCorrect(labels1_->data(), 0, k));
    correct += right;
  }
  return correct;
}

absl::StatusOr<std::unique_ptr<Model>> NewPipelinedModel(const std::string& name, Backend* first, Backend* second,
                                                         int max_batch, int micro_batches) {
  if (name != LeNet::kName) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, " cannot be split across devices (",
                                                   "--model_parallel=2 splits lenet: its convolutions on the "
                                                   "first device, its dense layers on the second)"));
  }
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<PipelinedLeNet> model,
                         PipelinedLeNet::Create(first, second, max_batch, micro_batches));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace summa::worker
