#include "common/optimizer.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace summa {
namespace {

// The inputs tests/optimizer_reference.py gave torch.optim (see its docstring).
constexpr int kWeights = 8;
float Initial(int i) { return 0.5f - 0.125f * i; }
float MeanGradient(int t, int i) { return static_cast<float>(((i * 7 + t * 13) % 17) - 8) / 8.0f; }

struct Case {
  std::string name;
  OptimizerOptions options;
  std::vector<std::vector<float>> steps;  // the weights after each update
};

std::vector<Case> ReadReference() {
  std::ifstream in(std::string(SUMMA_SOURCE_DIR) + "/tests/data/optimizer_reference.txt");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.empty()) continue;
    if (f[0] == "case") {
      Case c;
      c.name = f[1];
      for (size_t i = 2; i < f.size(); ++i) {
        std::pair<std::string, std::string> kv = absl::StrSplit(f[i], '=');
        double v = 0;
        if (kv.first == "optimizer") {
          c.options.name = kv.second;
          continue;
        }
        EXPECT_TRUE(absl::SimpleAtod(kv.second, &v)) << line;
        if (kv.first == "lr") c.options.learning_rate = v;
        if (kv.first == "momentum") c.options.momentum = v;
        if (kv.first == "nesterov") c.options.nesterov = v != 0;
        if (kv.first == "weight_decay") c.options.weight_decay = v;
        if (kv.first == "beta1") c.options.beta1 = v;
        if (kv.first == "beta2") c.options.beta2 = v;
        if (kv.first == "eps") c.options.eps = v;
      }
      // torch's AdamW decays by 0.01 unless told.
      if (c.options.name == "adamw" && line.find("weight_decay=") == std::string::npos) {
        c.options.weight_decay = 0.01;
      }
      cases.push_back(c);
    } else if (f[0] == "step") {
      std::vector<float> w;
      for (size_t i = 2; i < f.size(); ++i) {
        float v = 0;
        EXPECT_TRUE(absl::SimpleAtof(f[i], &v)) << line;
        w.push_back(v);
      }
      cases.back().steps.push_back(w);
    }
  }
  return cases;
}

TEST(OptimizerTest, MatchesTorchOptimOnTheRecordedTrajectories) {
  const std::vector<Case> cases = ReadReference();
  ASSERT_EQ(cases.size(), 7u) << "tests/data/optimizer_reference.txt is missing or short";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto opt = Optimizer::Create(c.options);
    ASSERT_TRUE(opt.ok()) << opt.status();
    std::vector<float> w(kWeights);
    for (int i = 0; i < kWeights; ++i) w[i] = Initial(i);
    std::vector<std::vector<float>> slots((*opt)->SlotNames().size(), std::vector<float>(kWeights, 0.0f));
    std::vector<absl::Span<float>> views;
    for (auto& s : slots) views.push_back(absl::MakeSpan(s));
    ASSERT_EQ(c.steps.size(), 12u);
    for (size_t t = 0; t < c.steps.size(); ++t) {
      // Pushed as a sum over 4 examples: the optimizer divides it back to the mean.
      std::vector<float> sum(kWeights);
      for (int i = 0; i < kWeights; ++i) sum[i] = 4.0f * MeanGradient(static_cast<int>(t), i);
      (*opt)->Apply(t, (*opt)->LearningRate(t), absl::MakeSpan(w), views, sum, 4);
      for (int i = 0; i < kWeights; ++i) {
        const float want = c.steps[t][i];
        EXPECT_NEAR(w[i], want, 1e-6 * std::max(1.0f, std::fabs(want)))
            << "update " << t << ", weight " << i;
      }
    }
  }
}

TEST(OptimizerTest, SlotsAreNamedForCheckpoints) {
  OptimizerOptions o;
  EXPECT_TRUE((*Optimizer::Create(o))->SlotNames().empty());
  o.momentum = 0.9;
  EXPECT_EQ((*Optimizer::Create(o))->SlotNames(), std::vector<std::string>{"momentum_buffer"});
  o.name = "adamw";
  EXPECT_EQ((*Optimizer::Create(o))->SlotNames(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

TEST(OptimizerTest, ZeroExamplesLeaveTheWeightsAlone) {
  OptimizerOptions o;
  o.name = "adam";
  auto opt = *Optimizer::Create(o);
  std::vector<float> w = {1, 2}, m = {0, 0}, v = {0, 0};
  std::vector<absl::Span<float>> slots = {absl::MakeSpan(m), absl::MakeSpan(v)};
  opt->Apply(0, opt->LearningRate(0), absl::MakeSpan(w), slots, std::vector<float>{5, 5}, 0);
  EXPECT_EQ(w, (std::vector<float>{1, 2}));
  EXPECT_EQ(m, (std::vector<float>{0, 0}));
}

TEST(OptimizerTest, SchedulesGiveTheRateOfEachUpdate) {
  OptimizerOptions o;
  o.learning_rate = 0.8;
  o.schedule = LrSchedule::kStep;
  o.step_size = 3;
  o.gamma = 0.5;
  auto step = *Optimizer::Create(o);
  EXPECT_DOUBLE_EQ(step->LearningRate(0), 0.8);
  EXPECT_DOUBLE_EQ(step->LearningRate(2), 0.8);
  EXPECT_DOUBLE_EQ(step->LearningRate(3), 0.4);
  EXPECT_DOUBLE_EQ(step->LearningRate(7), 0.2);

  o.schedule = LrSchedule::kCosine;
  o.warmup_steps = 4;
  o.total_steps = 14;
  auto cosine = *Optimizer::Create(o);
  EXPECT_DOUBLE_EQ(cosine->LearningRate(0), 0.2);
  EXPECT_DOUBLE_EQ(cosine->LearningRate(3), 0.8);
  EXPECT_DOUBLE_EQ(cosine->LearningRate(4), 0.8);
  EXPECT_NEAR(cosine->LearningRate(9), 0.4, 1e-12);  // halfway down
  EXPECT_DOUBLE_EQ(cosine->LearningRate(14), 0.0);
  EXPECT_DOUBLE_EQ(cosine->LearningRate(100), 0.0);
  EXPECT_NE(cosine->Describe().find("cosine(warmup_steps=4, total_steps=14)"), std::string::npos)
      << cosine->Describe();

  // The schedule drives the update: plain SGD at update 3 of the step schedule moves half as far.
  o.schedule = LrSchedule::kStep;
  auto sgd = *Optimizer::Create(o);
  std::vector<float> w = {0};
  sgd->Apply(3, sgd->LearningRate(3), absl::MakeSpan(w), {}, std::vector<float>{1}, 1);
  EXPECT_FLOAT_EQ(w[0], -0.4f);
}

TEST(OptimizerTest, RefusesBadOptionsNamingThem) {
  auto refused = [](OptimizerOptions o) {
    auto r = Optimizer::Create(o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  OptimizerOptions o;
  o.name = "rmsprop";
  EXPECT_NE(refused(o).find("use sgd, adam, adamw or adagrad"), std::string::npos);
  o = {};
  o.learning_rate = -1;
  EXPECT_NE(refused(o).find("learning rate"), std::string::npos);
  o = {};
  o.momentum = 1.0;
  EXPECT_NE(refused(o).find("momentum"), std::string::npos);
  o = {};
  o.nesterov = true;
  EXPECT_NE(refused(o).find("nesterov"), std::string::npos);
  o = {};
  o.name = "adam";
  o.beta2 = 1.5;
  EXPECT_NE(refused(o).find("beta2"), std::string::npos);
  o = {};
  o.name = "adam";
  o.eps = 0;
  EXPECT_NE(refused(o).find("eps"), std::string::npos);
  o = {};
  o.schedule = LrSchedule::kCosine;
  o.total_steps = 0;
  EXPECT_NE(refused(o).find("--lr_total_steps"), std::string::npos);
  o = {};
  o.schedule = LrSchedule::kStep;
  EXPECT_NE(refused(o).find("--lr_step_size"), std::string::npos);
  EXPECT_EQ(ParseLrSchedule("linear").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace summa
