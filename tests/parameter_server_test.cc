#include "server/parameter_server.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Two tensors, 6 floats in all, cut into partitions of 4 and 2 floats.
class ParameterServerTest : public ::testing::Test {
 protected:
  ParameterServerTest() : ps_(Options()) {}

  static ServerOptions Options() {
    ServerOptions o;
    o.world_size = 2;
    o.sgd.learning_rate = 1.0;
    o.partition_bytes = 16;
    o.barrier_deadline = absl::Seconds(30);
    return o;
  }

  JoinRequestView JoinView(int rank, bool with_values) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, {2, 2}}, with_values ? absl::string_view(w_) : absl::string_view()},
                {{"b", DType::kFloat32, {2}}, with_values ? absl::string_view(b_) : absl::string_view()}};
    return v;
  }

  void JoinBoth() {
    ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
    ASSERT_TRUE(ps_.Join(JoinView(1, false)).ok());
  }

  PushRequestView PushView(int rank, uint64_t step, uint32_t partition, const std::string& data,
                           int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.partition = partition;
    v.num_examples = examples;
    v.data = data;
    return v;
  }

  const std::string w_ = Bytes({1, 2, 3, 4});
  const std::string b_ = Bytes({10, 20});
  ParameterServer ps_;
};

TEST_F(ParameterServerTest, FirstJoinWithValuesDefinesTheModel) {
  EXPECT_EQ(ps_.Join(JoinView(1, false)).status().code(), absl::StatusCode::kUnavailable);
  auto joined = ps_.Join(JoinView(0, true));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank, 0);
  EXPECT_EQ(joined->version, 0u);
  ASSERT_EQ(joined->partitions.size(), 2u);
  EXPECT_EQ(ps_.WeightsForTest(), (std::vector<float>{1, 2, 3, 4, 10, 20}));
  EXPECT_TRUE(ps_.Join(JoinView(1, false)).ok());
  const StatusSnapshot s = ps_.Status();
  EXPECT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.parameter_count, 6);
  EXPECT_EQ(s.partition_count, 2);
}

TEST_F(ParameterServerTest, SyncStepsSumEveryPushAndDivideByTotalExamples) {
  JoinBoth();
  for (uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> before = ps_.WeightsForTest();
    auto pull0 = std::make_shared<FakeCall>();
    ps_.Pull(0, 0, step + 1, "", pull0);
    EXPECT_FALSE(pull0->answered()) << "a pull for the next version must wait for the step";
    // rank 0: 3 examples, rank 1: 1 example; partition 0 holds w, partition 1 holds b.
    ASSERT_EQ(*ps_.Push(PushView(0, step, 0, Bytes({4, 8, 0, 4}), 3)), false);
    ASSERT_EQ(*ps_.Push(PushView(0, step, 1, Bytes({4, 4}), 3)), false);
    ASSERT_EQ(*ps_.Push(PushView(1, step, 1, Bytes({0, 4}), 1)), true);
    EXPECT_FALSE(pull0->answered());
    ASSERT_EQ(*ps_.Push(PushView(1, step, 0, Bytes({0, 0, 4, 0}), 1)), true);
    ASSERT_TRUE(pull0->Wait().ok());
    EXPECT_EQ(pull0->counter(), step + 1);
    const std::vector<float> after = ps_.WeightsForTest();
    // sum / 4 examples * lr 1
    const std::vector<float> delta = {1, 2, 1, 1, 1, 2};
    for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[i] - delta[i]) << i;
    EXPECT_EQ(pull0->values(), std::vector<float>(after.begin(), after.begin() + 4));
  }
  EXPECT_EQ(ps_.Status().version, 3u);
  EXPECT_EQ(ps_.Status().pushes_served, 12u);
}

TEST_F(ParameterServerTest, BadPushesAreRefusedAndChangeNothing) {
  JoinBoth();
  const std::vector<float> before = ps_.WeightsForTest();
  const std::string good = Bytes({1, 1, 1, 1});
  struct Case {
    const char* what;
    PushRequestView view;
    absl::StatusCode code;
  };
  PushRequestView wrong_dtype = PushView(0, 0, 0, good, 1);
  wrong_dtype.dtype_is_float32 = false;
  std::vector<Case> cases = {
      {"unknown partition", PushView(0, 0, 7, good, 1), absl::StatusCode::kInvalidArgument},
      {"short data", PushView(0, 0, 0, Bytes({1, 1, 1}), 1), absl::StatusCode::kInvalidArgument},
      {"odd byte length", PushView(0, 0, 0, good + "x", 1), absl::StatusCode::kInvalidArgument},
      {"wrong dtype", wrong_dtype, absl::StatusCode::kInvalidArgument},
      {"negative examples", PushView(0, 0, 0, good, -1), absl::StatusCode::kInvalidArgument},
      {"rank outside group", PushView(2, 0, 0, good, 1), absl::StatusCode::kInvalidArgument},
      {"negative rank", PushView(-1, 0, 0, good, 1), absl::StatusCode::kInvalidArgument},
      {"future step", PushView(0, 5, 0, good, 1), absl::StatusCode::kOutOfRange},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ps_.Push(c.view).status().code(), c.code) << c.what;
  }
  // A duplicate is refused and not counted: rank 1's single push must not complete the step.
  ASSERT_TRUE(ps_.Push(PushView(0, 0, 0, good, 1)).ok());
  auto dup = ps_.Push(PushView(0, 0, 0, good, 1));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  EXPECT_EQ(ps_.WeightsForTest(), before);
  ASSERT_EQ(*ps_.Push(PushView(1, 0, 0, good, 1)), true);
  // 2 pushes of ones over 2 examples: each weight moves by exactly 1, not 1.5.
  EXPECT_EQ(ps_.WeightsForTest()[0], before[0] - 1);
  // Step 0 of partition 0 is now finished.
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, good, 1)).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ParameterServerTest, PushBeforeJoinIsRefused) {
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, Bytes({1, 1, 1, 1}), 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
  auto not_joined = ps_.Push(PushView(1, 0, 0, Bytes({1, 1, 1, 1}), 1));
  EXPECT_EQ(not_joined.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_joined.status().message().find("has not joined"), absl::string_view::npos);
}

TEST_F(ParameterServerTest, JoinsThatDisagreeAreRefused) {
  ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
  JoinRequestView wrong_shape = JoinView(1, false);
  wrong_shape.params[0].spec.shape = {4, 1};
  auto r = ps_.Join(wrong_shape);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("[2, 2]"), absl::string_view::npos) << r.status();
  JoinRequestView extra = JoinView(1, false);
  extra.params.push_back({{"ghost", DType::kFloat32, {3}}, ""});
  r = ps_.Join(extra);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("unknown parameter 'ghost'"), absl::string_view::npos);
  JoinRequestView renamed = JoinView(1, false);
  renamed.params[1].spec.name = "bias";
  EXPECT_EQ(ps_.Join(renamed).status().code(), absl::StatusCode::kFailedPrecondition);
  JoinRequestView world = JoinView(1, false);
  world.world_size = 3;
  EXPECT_EQ(ps_.Join(world).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Join(JoinView(5, false)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Status().members.size(), 1u);
}

TEST_F(ParameterServerTest, BadInitialValuesAreRefused) {
  JoinRequestView v = JoinView(0, true);
  v.params[0].data = w_.substr(0, 8);
  EXPECT_EQ(ps_.Join(v).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ps_.Status().model_defined);
}

TEST_F(ParameterServerTest, ParkedPullExpiresAtItsDeadlineNamingMissingRanks) {
  JoinBoth();
  ASSERT_TRUE(ps_.Push(PushView(0, 0, 0, Bytes({1, 1, 1, 1}), 1)).ok());
  auto pull = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 1, "", pull);
  ps_.ExpireParked(absl::Now());
  EXPECT_FALSE(pull->answered());
  ps_.ExpireParked(absl::Now() + absl::Seconds(31));
  absl::Status s = pull->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("waits for pushes from rank 1"), absl::string_view::npos) << s;
}

TEST_F(ParameterServerTest, PullTooFarAheadAndShutdownAnswerAtOnce) {
  JoinBoth();
  auto far = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 5, "", far);
  EXPECT_EQ(far->Wait().code(), absl::StatusCode::kOutOfRange);
  auto parked = std::make_shared<FakeCall>();
  ps_.Pull(0, 1, 1, "", parked);
  ps_.Shutdown();
  EXPECT_EQ(parked->Wait().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ParameterServerTest, CancelledCallIsDroppedWhenTheStepCompletes) {
  JoinBoth();
  auto pull = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 1, "", pull);
  ASSERT_TRUE(pull->Claim());  // the client cancelled: the edge claimed it first
  ASSERT_TRUE(ps_.Push(PushView(0, 0, 0, Bytes({1, 1, 1, 1}), 1)).ok());
  ASSERT_TRUE(ps_.Push(PushView(1, 0, 0, Bytes({1, 1, 1, 1}), 1)).ok());
  EXPECT_FALSE(pull->answered());
}

}  // namespace
}  // namespace summa::server
