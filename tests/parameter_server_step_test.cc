// What a step applies (server/core/parameter_server_data.cc with the aggregator and the optimizer):
// the sum in arrival or rank order (--deterministic), non-finite gradients refused, skipped or
// zeroed (--nonfinite), Adam's count of the updates it made, and the learning-rate schedule's rate
// for each version.
#include "server/core/parameter_server.h"

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

// --deterministic: three workers whose pushes arrive in two different orders, three steps of
// them, end with the same weights bit for bit; summed on arrival they do not (the test's pushes
// are chosen so that float addition's order shows: 1e8 + 1 rounds to 1e8).
std::vector<float> WeightsAfterArrivals(bool deterministic, const std::vector<int>& order) {
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 3;
  o.deterministic = deterministic;
  o.optimizer.learning_rate = 1.0;
  o.partition_bytes = 8;  // 4 floats: two partitions of 2
  o.barrier_deadline = absl::Seconds(30);
  EXPECT_TRUE(ValidateOptions(o).ok());
  ParameterServer ps(o);
  const std::string zeros = Bytes({0, 0, 0, 0});
  for (int rank = 0; rank < 3; ++rank) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 3;
    v.params = {{{"w", DType::kFloat32, {4}}, rank == 0 ? absl::string_view(zeros) : absl::string_view()}};
    EXPECT_TRUE(ps.Join(v).ok());
  }
  const std::vector<std::vector<float>> grads = {{1, 3, 1, -1}, {1e8f, -1e8f, -1e8f, 1e8f},
                                                 {-1e8f, 1e8f, 1e8f, -1e8f}};
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint32_t partition = 0; partition < 2; ++partition) {
      for (int rank : order) {
        PushRequestView v;
        v.rank = rank;
        v.step = step;
        v.partition = partition;
        v.num_examples = 1;
        const std::string data = Bytes({grads[rank][2 * partition], grads[rank][2 * partition + 1]});
        v.data = data;
        EXPECT_TRUE(ps.Push(v).ok()) << "rank " << rank << " step " << step;
      }
    }
  }
  EXPECT_EQ(ps.Status().version, 3u);
  return Weights(ps);
}

TEST(DeterministicAggregationTest, ArrivalOrderDoesNotChangeTheWeights) {
  const std::vector<float> in_rank_order = WeightsAfterArrivals(true, {0, 1, 2});
  EXPECT_EQ(WeightsAfterArrivals(true, {2, 1, 0}), in_rank_order);
  EXPECT_EQ(WeightsAfterArrivals(true, {1, 2, 0}), in_rank_order);
  // The rank-order sum each step is 0 in every element: the weights never move.
  EXPECT_EQ(in_rank_order, (std::vector<float>{0, 0, 0, 0}));
}

TEST(DeterministicAggregationTest, SumOnArrivalDependsOnTheOrder) {
  EXPECT_NE(WeightsAfterArrivals(false, {0, 1, 2}), WeightsAfterArrivals(false, {1, 2, 0}));
}

TEST(DeterministicAggregationTest, OnlySyncModeTakesIt) {
  ServerOptions o;
  o.deterministic = true;
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (Mode mode : {Mode::kAsync, Mode::kSsp}) {
    o.mode = mode;
    const absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--mode=sync"), std::string::npos) << s;
  }
}

TEST_F(MembershipTest, NonFiniteGradientsAreRejectedByDefaultNamingWhereTheyAre) {
  auto ps = Make(ServerOptions());
  std::vector<float> bad = {0, 1, std::nanf(""), 3};
  const std::string bytes(reinterpret_cast<const char*>(bad.data()), 16);
  auto refused = ps->Push(Push(1, 0, bytes, 2));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"rank 1", "step 0", "partition 0", "element 2 is nan"}) {
    EXPECT_NE(refused.status().message().find(part), absl::string_view::npos) << refused.status();
  }
  // Nothing changed: both ranks push finite gradients and the step is theirs alone.
  ASSERT_TRUE(ps->Push(Push(0, 0, twos_, 2)).ok());
  ASSERT_EQ(*ps->Push(Push(1, 0, twos_, 2)), true);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));
  EXPECT_EQ(ps->Status().nonfinite_pushes, 1u);
  // A 16-bit push names its wire dtype (an infinity in fp16 is a value past 65504 sent without
  // saturating, or a real one).
  const uint16_t halves[4] = {0, 0, 0x7c00, 0};
  const std::string half_bytes(reinterpret_cast<const char*>(halves), sizeof(halves));
  auto fp16 = Push(1, 1, half_bytes, 2);
  fp16.dtype = WireDType::kFloat16;
  refused = ps->Push(fp16);
  EXPECT_NE(refused.status().message().find("element 2 is inf (sent as fp16)"), absl::string_view::npos)
      << refused.status();
}

TEST_F(MembershipTest, NonFiniteGradientsCanSkipTheStepOrCountAsZero) {
  std::vector<float> bad = {2, std::numeric_limits<float>::infinity(), 2, 2};
  const std::string bytes(reinterpret_cast<const char*>(bad.data()), 16);
  ServerOptions o;
  o.require_sessions = false;
  o.nonfinite = NonFinite::kSkipStep;
  auto skip = Make(o);
  ASSERT_TRUE(skip->Push(Push(0, 0, bytes, 2)).ok());
  ASSERT_EQ(*skip->Push(Push(1, 0, twos_, 2)), true);
  EXPECT_EQ(Weights(*skip), std::vector<float>(4, 0)) << "the step applied nothing";
  EXPECT_EQ(skip->Status().version, 1u) << "but it completed, so the workers go on";
  o.nonfinite = NonFinite::kZero;
  auto zero = Make(o);
  ASSERT_TRUE(zero->Push(Push(0, 0, bytes, 2)).ok());
  ASSERT_TRUE(zero->Push(Push(1, 0, twos_, 2)).ok());
  EXPECT_EQ(Weights(*zero), (std::vector<float>{-1, -0.5f, -1, -1}));  // (2 + 0 + ...) / 4
  EXPECT_EQ(zero->Status().nonfinite_pushes, 1u);
}

TEST(AdamTest, AStepThatAppliesNothingIsNotCountedByTheBiasCorrection) {
  // torch counts only the updates it made: Adam after (skipped step, g) equals Adam after (g).
  auto run = [](bool skip_first) {
      ServerOptions o;
    o.require_sessions = false;  // these cases are about other things; sessions: SessionTest
    o.world_size = 1;
    o.optimizer.name = "adam";
    o.optimizer.learning_rate = 0.1;
    o.nonfinite = NonFinite::kSkipStep;
    ParameterServer ps(o);
    const std::vector<float> init = {1, 2};
    JoinRequestView v;
    v.rank = 0;
    v.world_size = 1;
    const std::string bytes(reinterpret_cast<const char*>(init.data()), 8);
    v.params = {{{"w", DType::kFloat32, {2}}, bytes}};
    EXPECT_TRUE(ps.Join(v).ok());
    uint64_t step = 0;
    auto push = [&](std::vector<float> g) {
      const std::string data(reinterpret_cast<const char*>(g.data()), 8);
      PushRequestView r;
      r.step = step++;
      r.num_examples = 1;
      r.data = data;
      EXPECT_TRUE(ps.Push(r).ok());
    };
    if (skip_first) push({std::nanf(""), 1});
    push({0.5f, -0.25f});
    return Weights(ps);
  };
  EXPECT_EQ(run(true), run(false));
}

// The learning-rate schedule as the server applies it, step by step: update k of a sync job
// (the step that takes the weights from version k to k + 1) runs at the schedule's rate for k,
// computed here from the formula of OptimizerOptions, not from the optimizer. Two ranks push
// {2, 4, 1, -2} and zeros over 2 examples each step, a mean gradient of {1, 2, 0.5, -1}: the
// server's float arithmetic (w -= lr * (g * scale + wd * w), lr the rate as a float) is repeated
// here exactly, so every weight after every step is compared for equality. A step that applies
// nothing (a non-finite push under --nonfinite=skip_step) still takes its version: the schedule
// counts versions, not updates.
std::vector<float> Apply(std::vector<float> w, double rate) {
  const std::vector<float> grad_sum = {2, 4, 1, -2};
  const float scale = static_cast<float>(1.0 / 2.0);
  const float lr = static_cast<float>(rate);
  const float wd = 0.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * (grad_sum[i] * scale + wd * w[i]);
  return w;
}

void ExpectScheduleAppliedStepByStep(const OptimizerOptions& optimizer, const std::function<double(uint64_t)>& rate,
                                     uint64_t steps, uint64_t skipped) {
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 2;
  o.optimizer = optimizer;
  o.nonfinite = NonFinite::kSkipStep;
  ParameterServer ps(o);
  std::vector<float> expected = {1, 2, 3, 4};
  const std::string initial(reinterpret_cast<const char*>(expected.data()), 16);
  for (int rank : {0, 1}) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, {4}}, rank == 0 ? absl::string_view(initial) : absl::string_view()}};
    ASSERT_TRUE(ps.Join(v).ok());
  }
  const std::vector<float> g0 = {2, 4, 1, -2};
  const std::vector<float> zeros = {0, 0, 0, 0};
  const std::vector<float> bad = {std::nanf(""), 0, 0, 0};
  const std::string g0_bytes(reinterpret_cast<const char*>(g0.data()), 16);
  const std::string zero_bytes(reinterpret_cast<const char*>(zeros.data()), 16);
  const std::string bad_bytes(reinterpret_cast<const char*>(bad.data()), 16);
  for (uint64_t k = 0; k < steps; ++k) {
    SCOPED_TRACE(absl::StrCat("update ", k, " at rate ", rate(k)));
    // What the server reports as the rate of its next update.
    EXPECT_DOUBLE_EQ(ps.Status().learning_rate, rate(k));
    std::shared_ptr<FakeCall> replies[2] = {std::make_shared<FakeCall>(), std::make_shared<FakeCall>()};
    for (int rank : {0, 1}) {
      PushRequestView r;
      r.rank = rank;
      r.step = k;
      r.num_examples = 1;
      r.data = rank == 0 ? g0_bytes : k == skipped ? bad_bytes : zero_bytes;
      ps.PushPull(r, replies[rank]);
    }
    if (k != skipped) expected = Apply(expected, rate(k));
    for (const auto& reply : replies) {
      ASSERT_TRUE(reply->Wait().ok());
      EXPECT_EQ(reply->counter(), k + 1);
      EXPECT_EQ(reply->values(), expected);
    }
    // The first update that goes wrong is the one to read about: the later ones follow from it.
    ASSERT_EQ(Weights(ps), expected);
  }
  EXPECT_EQ(ps.Status().version, steps);
}

TEST(LrScheduleTest, TheStepScheduleGivesEachSyncStepTheRateOfItsOwnVersion) {
  OptimizerOptions o;
  o.learning_rate = 0.75;
  o.schedule = LrSchedule::kStep;
  o.step_size = 2;
  o.gamma = 0.5;
  // lr * gamma^floor(k / step_size): 0.75, 0.75, 0.375, 0.375, 0.1875, ...
  auto rate = [](uint64_t k) { return 0.75 * std::pow(0.5, static_cast<double>(k / 2)); };
  ExpectScheduleAppliedStepByStep(o, rate, /*steps=*/7, /*skipped=*/99);
  // Step 2 applies nothing; step 3 still runs at the rate of version 3 (0.375), and step 4 at
  // that of version 4 (0.1875), though only 3 updates came before it.
  ExpectScheduleAppliedStepByStep(o, rate, /*steps=*/7, /*skipped=*/2);
}

TEST(LrScheduleTest, TheCosineScheduleWithWarmUpGivesEachSyncStepTheRateOfItsOwnVersion) {
  OptimizerOptions o;
  o.learning_rate = 0.8;
  o.schedule = LrSchedule::kCosine;
  o.warmup_steps = 3;
  o.total_steps = 8;
  // Linear warm-up lr * (k + 1) / warmup over updates 0..2, then half a cosine from lr at update
  // 3 down to 0 at update 8, and 0 after: the updates past total_steps leave the weights alone.
  auto rate = [](uint64_t k) {
    const double lr = 0.8, warmup = 3, total = 8, t = static_cast<double>(k);
    if (t < warmup) return lr * (t + 1) / warmup;
    if (t >= total) return 0.0;
    const double progress = (t - warmup) / (total - warmup);
    return 0.5 * lr * (1.0 + std::cos(M_PI * progress));
  };
  ExpectScheduleAppliedStepByStep(o, rate, /*steps=*/10, /*skipped=*/99);
}

}  // namespace
}  // namespace summa::server
