// The model factory and the chunk loop every model shares (worker/models/model.cc), for every model.
#include "worker/models/model.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace summa::worker {
namespace {

TEST(ModelTest, TheFactoryKnowsEveryModelAndNamesTheChoices) {
  auto backend = NewCpuBackend(1);
  EXPECT_EQ(ModelNames(), (std::vector<std::string>{"lenet", "mlp"}));
  for (const std::string& name : ModelNames()) {
    auto model = NewModel(name, backend.get(), 2);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->name(), name);
    EXPECT_EQ((*model)->image_floats(), 784);
    EXPECT_EQ((*model)->classes(), 10);
    EXPECT_EQ((*model)->num_params(), CountParams(*ModelSpecs(name)));
    EXPECT_EQ(static_cast<int64_t>((*model)->InitialWeights(1).size()), (*model)->num_params());
  }
  const auto unknown = NewModel("vgg", backend.get(), 2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_EQ(unknown.status().message(), "unknown model 'vgg' (choose one of lenet, mlp)");
  EXPECT_TRUE(absl::IsInvalidArgument(ModelSpecs("vgg").status()));
}

TEST(ModelTest, ChunkedPassesSumToTheWholeBatchGradient) {
  auto backend = NewCpuBackend(1);
  for (const std::string& name : ModelNames()) {
    SCOPED_TRACE(name);
    auto whole = NewModel(name, backend.get(), 5);
    auto chunked = NewModel(name, backend.get(), 5, 2);  // chunks of 2, 2 and 1
    ASSERT_TRUE(whole.ok() && chunked.ok());
    const std::vector<float> w = (*whole)->InitialWeights(4);
    std::vector<float> images(5 * 784);
    for (size_t i = 0; i < images.size(); ++i) images[i] = float(i % 97) / 97;
    const std::vector<float> labels = {0, 3, 3, 9, 1};
    std::vector<float> g1(w.size()), g2(w.size());
    for (auto* net : {&*whole, &*chunked}) ASSERT_TRUE((*net)->SetWeights(w.data()).ok());
    const double l1 = *GradientsAndLoss(**whole, images.data(), labels.data(), 5);
    const double l2 = *GradientsAndLoss(**chunked, images.data(), labels.data(), 5);
    EXPECT_NEAR(l1, l2, 1e-5);
    ASSERT_TRUE((*whole)->GetGradients(g1.data()).ok());
    ASSERT_TRUE((*chunked)->GetGradients(g2.data()).ok());
    for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g1[i], g2[i], 1e-6 + 1e-4 * std::abs(g1[i])) << i;
    EXPECT_EQ(*(*whole)->CountCorrect(images.data(), labels.data(), 5),
              *(*chunked)->CountCorrect(images.data(), labels.data(), 5));
    // No examples: zero gradients, zero loss; more than the model holds: refused.
    auto empty = GradientsAndLoss(**chunked, nullptr, nullptr, 0);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(*empty, 0.0);
    ASSERT_TRUE((*chunked)->GetGradients(g2.data()).ok());
    EXPECT_EQ(g2, std::vector<float>(w.size(), 0.0f));
    std::vector<float> six(6 * 784, 0.5f);
    EXPECT_FALSE(GradientsAndLoss(**chunked, six.data(), std::vector<float>(6, 1).data(), 6).ok());
    EXPECT_FALSE((*chunked)->CountCorrect(six.data(), std::vector<float>(6, 1).data(), 6).ok());
  }
}

// A batch gathered from tables by row indices (Examples::Resident, the trainer's path) trains
// exactly as the same examples given as host arrays, whole and in chunks; losses add up on the
// device until TakeLoss, which starts again at zero; a bad label surfaces there.
TEST(ModelTest, ResidentExamplesMatchHostArraysAndLossesAddUp) {
  auto backend = NewCpuBackend(1);
  for (const std::string& name : ModelNames()) {
    SCOPED_TRACE(name);
    for (int chunk : {0, 2}) {
      auto host = NewModel(name, backend.get(), 5, chunk);
      auto resident = NewModel(name, backend.get(), 5, chunk);
      ASSERT_TRUE(host.ok() && resident.ok());
      const std::vector<float> w = (*host)->InitialWeights(4);
      for (auto* net : {&*host, &*resident}) ASSERT_TRUE((*net)->SetWeights(w.data()).ok());
      // A table of 9 examples; the batch is rows 7, 2, 2, 0, 5.
      std::vector<float> table(9 * 784), table_labels(9);
      for (size_t i = 0; i < table.size(); ++i) table[i] = float((i * 31) % 101) / 101;
      for (int r = 0; r < 9; ++r) table_labels[r] = float((r * 7) % 10);
      const std::vector<float> rows = {7, 2, 2, 0, 5};
      std::vector<float> images, labels;
      for (float r : rows) {
        images.insert(images.end(), table.begin() + int(r) * 784, table.begin() + int(r) * 784 + 784);
        labels.push_back(table_labels[int(r)]);
      }
      ASSERT_TRUE((*host)->ComputeGradients(Examples::Host(images.data(), labels.data()), 5).ok());
      ASSERT_TRUE((*resident)->ComputeGradients(
          Examples::Resident(table.data(), table_labels.data(), rows.data()), 5).ok());
      std::vector<float> g1(w.size()), g2(w.size());
      ASSERT_TRUE((*host)->GetGradients(g1.data()).ok());
      ASSERT_TRUE((*resident)->GetGradients(g2.data()).ok());
      EXPECT_EQ(g1, g2);
      const double once = *(*host)->TakeLoss();
      EXPECT_GT(once, 0.0);
      // Twice more without taking: the total holds both.
      for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE((*resident)->ComputeGradients(
            Examples::Resident(table.data(), table_labels.data(), rows.data()), 5).ok());
      }
      EXPECT_NEAR(*(*resident)->TakeLoss(), 3 * once, 1e-4 * once);
      EXPECT_EQ(*(*resident)->TakeLoss(), 0.0);
      const std::vector<float> bad = {0, 3, 10, 9, 1};
      ASSERT_TRUE((*host)->ComputeGradients(Examples::Host(images.data(), bad.data()), 5).ok());
      const auto refused = (*host)->TakeLoss();
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
      EXPECT_EQ(*(*host)->TakeLoss(), 0.0);  // and the total starts again
    }
  }
}

// Hooks that hand each layer its weights only when the model asks (BeforeForward: the model
// starts with garbage), and keep what each layer's gradients were when reported final.
class HandingHooks final : public LayerHooks {
 public:
  HandingHooks(Backend& backend, Model& model, const std::vector<float>& weights)
      : backend_(backend), model_(model), weights_(weights), layers_(model.layers()),
        reported_(model.num_params(), -1.0f) {}
  absl::Status BeforeForward(int l) override {
    calls.push_back(absl::StrCat("forward ", l));
    if (l == fail_before) return absl::AbortedError("no weights today");
    const LayerRange& r = layers_[l];
    return backend_.Upload(weights_.data() + r.offset, r.length, model_.weights()->data() + r.offset);
  }
  absl::Status GradientReady(int l) override {
    calls.push_back(absl::StrCat("backward ", l));
    const LayerRange& r = layers_[l];
    return backend_.Download(model_.gradients()->data() + r.offset, r.length, reported_.data() + r.offset);
  }
  std::vector<std::string> calls;
  int fail_before = -1;
  const std::vector<float>& reported() const { return reported_; }

 private:
  Backend& backend_;
  Model& model_;
  const std::vector<float>& weights_;
  const std::vector<LayerRange> layers_;
  std::vector<float> reported_;
};

// ComputeGradientsPerLayer, whole and in chunks, and for no examples: the layers cover the flat
// buffer end to end; each is asked for before its weights are read (the model starts with
// garbage, the hooks hand each layer its weights) and reported once its gradients are final
// (what the hook saw is the end result); forward first to last, backward last to first; the
// gradients are ComputeGradients', bit for bit. A hook's error ends the computation.
TEST(ModelTest, PerLayerHooksHandEachLayerItsWeightsAndSeeItsFinalGradients) {
  auto backend = NewCpuBackend(1);
  for (const std::string& name : ModelNames()) {
    for (int chunk : {0, 2}) {
      for (int n : {5, 0}) {
        SCOPED_TRACE(absl::StrCat(name, " chunk ", chunk, " n ", n));
        auto plain = NewModel(name, backend.get(), 5, chunk);
        auto hooked = NewModel(name, backend.get(), 5, chunk);
        ASSERT_TRUE(plain.ok() && hooked.ok());
        const std::vector<LayerRange> layers = (*hooked)->layers();
        ASSERT_GE(layers.size(), 2u);
        int64_t end = 0;
        for (const LayerRange& r : layers) {
          EXPECT_EQ(r.offset, end);
          end += r.length;
        }
        EXPECT_EQ(end, (*hooked)->num_params());
        const std::vector<float> w = (*plain)->InitialWeights(4);
        ASSERT_TRUE((*plain)->SetWeights(w.data()).ok());
        ASSERT_TRUE((*hooked)->SetWeights(std::vector<float>(w.size(), 7.0f).data()).ok());
        std::vector<float> images(5 * 784);
        for (size_t i = 0; i < images.size(); ++i) images[i] = float(i % 97) / 97;
        const std::vector<float> labels = {0, 3, 3, 9, 1};
        const Examples examples = Examples::Host(images.data(), labels.data());
        ASSERT_TRUE((*plain)->ComputeGradients(examples, n).ok());
        HandingHooks hooks(*backend, **hooked, w);
        ASSERT_TRUE((*hooked)->ComputeGradientsPerLayer(examples, n, hooks).ok());
        std::vector<std::string> expected;
        for (size_t l = 0; l < layers.size(); ++l) expected.push_back(absl::StrCat("forward ", l));
        for (size_t l = layers.size(); l-- > 0;) expected.push_back(absl::StrCat("backward ", l));
        EXPECT_EQ(absl::StrJoin(hooks.calls, ", "), absl::StrJoin(expected, ", "));
        std::vector<float> g1(w.size()), g2(w.size());
        ASSERT_TRUE((*plain)->GetGradients(g1.data()).ok());
        ASSERT_TRUE((*hooked)->GetGradients(g2.data()).ok());
        EXPECT_EQ(g1, g2);
        EXPECT_EQ(hooks.reported(), g2);
        EXPECT_EQ(*(*plain)->TakeLoss(), *(*hooked)->TakeLoss());
        HandingHooks failing(*backend, **hooked, w);
        failing.fail_before = 1;
        EXPECT_EQ((*hooked)->ComputeGradientsPerLayer(examples, n, failing).code(), absl::StatusCode::kAborted);
      }
    }
  }
}

}  // namespace
}  // namespace summa::worker
