// Model parallelism (pipeline.h): LeNet split across two CPU backends, its batch in
// micro-batches, gives the single-device gradient, loss and predictions.
#include "worker/models/pipeline.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/backend_checks.h"
#include "tests/split_check.h"
#include "worker/models/lenet.h"

namespace summa::worker {
namespace {

using testing_split::Batch;
using testing_split::RandomBatch;
using testing_split::Result;
using testing_split::SameStep;
using testing_split::Step;
using testing_split::Weights;

// LeNet whole on one CPU backend: the step a split model must match.
Result OneDevice(const std::vector<float>& w, const Batch& batch, int n) {
  auto one = NewCpuBackend(1);
  auto model = LeNet::Create(one.get(), n);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  return Step(**model, w, batch, n);
}

TEST(PipelineTest, SplitModelMatchesOneDeviceForEveryMicroBatchCount) {
  const int kBatch = 13;  // micro-batches of unequal sizes for most counts
  const std::vector<float> w = Weights();
  const Batch batch = RandomBatch(kBatch, 11);
  const Result want = OneDevice(w, batch, kBatch);
  float largest = 0;
  for (float g : want.gradient) largest = std::max(largest, std::abs(g));
  ASSERT_GT(largest, 0.1f);
  for (int micro : {1, 2, 3, 4, 13, 20}) {
    auto first = NewCpuBackend(1), second = NewCpuBackend(1);
    auto split = PipelinedLeNet::Create(first.get(), second.get(), kBatch, micro);
    ASSERT_TRUE(split.ok()) << split.status();
    // Twice: the second step must not keep anything of the first (a gradient summed into it).
    for (int step = 0; step < 2; ++step) {
      EXPECT_TRUE(SameStep(want, Step(**split, w, batch, kBatch))) << micro << " micro-batches, step " << step;
    }
    EXPECT_EQ((*split)->timing().count, 2);
  }
}

TEST(PipelineTest, SmallerBatchesAndAnEmptyShard) {
  const std::vector<float> w = Weights();
  const Batch batch = RandomBatch(5, 3);
  auto one = NewCpuBackend(1), first = NewCpuBackend(1), second = NewCpuBackend(1);
  auto reference_model = LeNet::Create(one.get(), 8);
  auto split = PipelinedLeNet::Create(first.get(), second.get(), 8, 4);
  ASSERT_TRUE(reference_model.ok() && split.ok());
  const Result want = Step(**reference_model, w, batch, 5);
  EXPECT_TRUE(SameStep(want, Step(**split, w, batch, 5)));
  // No examples: zero gradient, nothing added to the loss.
  absl::StatusOr<double> empty = GradientsAndLoss(**split, nullptr, nullptr, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0.0);
  std::vector<float> g(LeNet::NumParams(), 1.0f);
  ASSERT_TRUE((*split)->GetGradients(g.data()).ok());
  EXPECT_EQ(g, std::vector<float>(LeNet::NumParams(), 0.0f));
  EXPECT_EQ((*split)->ComputeGradients(Examples::Host(batch.images.data(), batch.labels.data()), 9).message(),
            "a batch of 9 examples exceeds the model's 8");
  EXPECT_EQ((*split)->ComputeGradients(Examples::Host(batch.images.data(), batch.labels.data()), -1).message(),
            "a batch of -1 examples: the count must not be negative");
}

// Forwards to a CPU backend, but the `fail_at`-th call (from 1) of LinearForward (the dense
// layers, on the second stage) or Conv2dForward (the convolutions, on the first) fails once.
class FailingOnce final : public checks::ForwardingBackend {
 public:
  FailingOnce(Backend* cpu, int fail_at) : ForwardingBackend(cpu), fail_at_(fail_at) {}
  absl::Status LinearForward(const float* x, const float* w, const float* bias, float* y, int batch, int in,
                             int out) override {
    if (++calls_ == fail_at_) return absl::ResourceExhaustedError("planted: the dense layers ran out of memory");
    return ForwardingBackend::LinearForward(x, w, bias, y, batch, in, out);
  }
  absl::Status Conv2dForward(const ConvShape& shape, const float* x, const float* w, const float* bias, float* y,
                             float* workspace) override {
    if (++calls_ == fail_at_) return absl::ResourceExhaustedError("planted: the convolutions ran out of memory");
    return ForwardingBackend::Conv2dForward(shape, x, w, bias, y, workspace);
  }

 private:
  const int fail_at_;
  int calls_ = 0;
};

TEST(PipelineTest, AStageThatFailsStopsTheOtherAndTheNextStepIsWhole) {
  // Four micro-batches. The head's LinearForward runs twice a micro-batch, as the features'
  // Conv2dForward does: failing the 4th call fails micro-batch 1 on the second stage (while the
  // first waits for its gradients) or micro-batch 1 on the first (while the second waits for its
  // features). Either way the step returns the failing stage's error, not the other's ABORTED,
  // and does not hang; the next step is the single-device step exactly.
  const int kBatch = 8;
  const std::vector<float> w = Weights();
  const Batch batch = RandomBatch(kBatch, 5);
  const Result want = OneDevice(w, batch, kBatch);
  for (int failing_stage : {0, 1}) {
    auto cpu0 = NewCpuBackend(1), cpu1 = NewCpuBackend(1);
    FailingOnce first(cpu0.get(), failing_stage == 0 ? 4 : 0), second(cpu1.get(), failing_stage == 1 ? 4 : 0);
    auto split = PipelinedLeNet::Create(&first, &second, kBatch, 4);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_TRUE((*split)->SetWeights(w.data()).ok());
    const absl::Status failed = (*split)->ComputeGradients(Examples::Host(batch.images.data(), batch.labels.data()),
                                                           kBatch);
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    EXPECT_NE(failed.message().find(failing_stage == 0 ? "convolutions" : "dense layers"), absl::string_view::npos)
        << failed;
    (*split)->TakeLoss().IgnoreError();  // the failed step's partial loss
    EXPECT_TRUE(SameStep(want, Step(**split, w, batch, kBatch))) << "stage " << failing_stage << " failed";
  }
}

TEST(PipelineTest, BadConfigurationsAreRefusedByName) {
  auto first = NewCpuBackend(1), second = NewCpuBackend(1);
  EXPECT_EQ(PipelinedLeNet::Create(first.get(), second.get(), 8, 0).status().message(),
            "micro-batches must be at least 1, got 0");
  EXPECT_FALSE(PipelinedLeNet::Create(first.get(), first.get(), 8, 2).ok());
  absl::StatusOr<std::unique_ptr<Model>> mlp = NewPipelinedModel("mlp", first.get(), second.get(), 8, 2);
  EXPECT_EQ(mlp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mlp.status().message().find("model mlp cannot be split"), absl::string_view::npos) << mlp.status();
}

}  // namespace
}  // namespace summa::worker
