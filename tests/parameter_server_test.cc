#include "server/core/parameter_server.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_reason.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"

#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_peer.h"

namespace summa::server {
namespace {

// The server's whole flat weights (tests/parameter_server_peer.h).
std::vector<float> Weights(const ParameterServer& ps) { return ParameterServerPeer::Weights(ps); }

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A sparse push's bytes (common/compression.h): positions, then float32 values.
std::string Sparse(const std::vector<uint32_t>& positions, const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(positions.data()), positions.size() * 4) + Bytes(values);
}

// `values` in a 16-bit wire dtype.
std::string Halves(WireDType dtype, const std::vector<float>& values) {
  std::string out(values.size() * 2, '\0');
  EncodeValues(dtype, values, out.data());
  return out;
}

// Restores `ps` from the newest whole checkpoint in `dir`, streamed as the daemon does.
absl::Status RestoreNewest(ParameterServer& ps, const std::string& dir,
                           std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> ignored;
  absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestCheckpoint(
      dir, [&](CheckpointReader& reader) { return ps.Restore(reader.header(), reader); },
      warnings != nullptr ? warnings : &ignored);
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return absl::NotFoundError("no checkpoint in " + dir);
  return absl::OkStatus();
}

// Two tensors, 6 floats in all, cut into partitions of 4 and 2 floats.
class ParameterServerTest : public ::testing::Test {
 protected:
  ParameterServerTest() : ps_(Options()) {}

  static ServerOptions Options() {
      ServerOptions o;
    o.require_sessions = false;  // these cases are about other things; sessions: SessionTest
    o.world_size = 2;
    o.optimizer.learning_rate = 1.0;
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

TEST_F(ParameterServerTest, InitialValuesFollowPartitionByPartition) {
  JoinRequestView definer = JoinView(0, false);
  definer.values_follow = true;
  auto joined = ps_.Join(definer);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(joined->initialize);
  ASSERT_EQ(joined->partitions.size(), 2u);
  EXPECT_EQ(ps_.Status().partitions_pending, 2);
  // Until every partition has values: joins without them wait, pushes and pulls are refused.
  absl::Status waiting = ps_.Join(JoinView(1, false)).status();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(waiting.message().find("0 of 2 partitions"), absl::string_view::npos) << waiting;
  const std::string grad = Bytes({1, 1, 1, 1});
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, grad, 1)).status().code(), absl::StatusCode::kFailedPrecondition);
  auto early = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 0, 0, early);
  EXPECT_EQ(early->Wait().code(), absl::StatusCode::kFailedPrecondition);
  // Bad values change nothing; a stranger is refused.
  const std::string wb = w_;
  EXPECT_EQ(ps_.Initialize({0, 0, true, absl::string_view(wb).substr(4)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({0, 7, true, wb}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({0, 0, false, wb}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({1, 0, true, wb}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ps_.Status().partitions_pending, 2);
  // The first values a partition gets are kept.
  EXPECT_EQ(*ps_.Initialize({0, 0, true, wb}), true);
  const std::string other = Bytes({9, 9, 9, 9});
  EXPECT_EQ(*ps_.Initialize({0, 0, true, other}), false);
  EXPECT_EQ(ps_.Status().partitions_pending, 1);
  EXPECT_EQ(*ps_.Initialize({0, 1, true, b_}), true);
  EXPECT_EQ(ps_.Status().partitions_pending, 0);
  EXPECT_EQ(Weights(ps_), (std::vector<float>{1, 2, 3, 4, 10, 20}));
  auto second = ps_.Join(JoinView(1, false));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->initialize);
  auto pulled = std::make_shared<FakeCall>();
  ps_.Pull(1, 0, 1, 0, pulled);
  ASSERT_TRUE(pulled->Wait().ok());
  EXPECT_EQ(pulled->values(), (std::vector<float>{10, 20}));
}

// Two workers in threads push-pull both partitions step after step, as the gRPC edge's threads
// drive the core: every step's sum is applied once and every reply carries its step's weights.
// The concurrency the TSan pass checks without gRPC (whose in-process tests it leaves out).
TEST_F(ParameterServerTest, WorkersInThreadsTakeExactSyncStepsThroughPushPull) {
  JoinBoth();
  constexpr uint64_t kSteps = 20;
  auto worker = [this](int rank) {
    const std::string grad0 = Bytes(std::vector<float>(4, rank + 1.0f));
    const std::string grad1 = Bytes(std::vector<float>(2, rank + 1.0f));
    for (uint64_t step = 0; step < kSteps; ++step) {
      auto reply0 = std::make_shared<FakeCall>();
      auto reply1 = std::make_shared<FakeCall>();
      ps_.PushPull(PushView(rank, step, 0, grad0, 1), reply0);
      ps_.PushPull(PushView(rank, step, 1, grad1, 1), reply1);
      for (const auto& reply : {reply0, reply1}) {
        ASSERT_TRUE(reply->Wait().ok());
        EXPECT_EQ(reply->counter(), step + 1);
      }
      // (1 + 2) / 2 examples at lr 1: every weight moves by 1.5 a step.
      EXPECT_EQ(reply1->values(), (std::vector<float>{10 - 1.5f * (step + 1), 20 - 1.5f * (step + 1)}));
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(Weights(ps_), (std::vector<float>{-29, -28, -27, -26, -20, -10}));
}

TEST_F(ParameterServerTest, FirstJoinWithValuesDefinesTheModel) {
  EXPECT_EQ(ps_.Join(JoinView(1, false)).status().code(), absl::StatusCode::kUnavailable);
  auto joined = ps_.Join(JoinView(0, true));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank, 0);
  EXPECT_EQ(joined->version, 0u);
  ASSERT_EQ(joined->partitions.size(), 2u);
  EXPECT_EQ(Weights(ps_), (std::vector<float>{1, 2, 3, 4, 10, 20}));
  EXPECT_TRUE(ps_.Join(JoinView(1, false)).ok());
  const StatusSnapshot s = ps_.Status();
  EXPECT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.parameter_count, 6);
  EXPECT_EQ(s.partition_count, 2);
}

TEST_F(ParameterServerTest, SyncStepsSumEveryPushAndDivideByTotalExamples) {
  JoinBoth();
  for (uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> before = Weights(ps_);
    auto pull0 = std::make_shared<FakeCall>();
    ps_.Pull(0, 0, 0, step + 1, pull0);
    EXPECT_FALSE(pull0->answered()) << "a pull for the next version must wait for the step";
    // rank 0: 3 examples, rank 1: 1 example; partition 0 holds w, partition 1 holds b.
    ASSERT_EQ(*ps_.Push(PushView(0, step, 0, Bytes({4, 8, 0, 4}), 3)), false);
    ASSERT_EQ(*ps_.Push(PushView(0, step, 1, Bytes({4, 4}), 3)), false);
    ASSERT_EQ(*ps_.Push(PushView(1, step, 1, Bytes({0, 4}), 1)), true);
    EXPECT_FALSE(pull0->answered());
    ASSERT_EQ(*ps_.Push(PushView(1, step, 0, Bytes({0, 0, 4, 0}), 1)), true);
    ASSERT_TRUE(pull0->Wait().ok());
    EXPECT_EQ(pull0->counter(), step + 1);
    const std::vector<float> after = Weights(ps_);
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
  const std::vector<float> before = Weights(ps_);
  const std::string good = Bytes({1, 1, 1, 1});
  struct Case {
    const char* what;
    PushRequestView view;
    absl::StatusCode code;
  };
  PushRequestView wrong_dtype = PushView(0, 0, 0, good, 1);
  wrong_dtype.dtype = std::nullopt;
  PushRequestView bf16_of_float32_length = PushView(0, 0, 0, good, 1);
  bf16_of_float32_length.dtype = WireDType::kBfloat16;
  const std::string past_the_end = Sparse({4}, {1});
  PushRequestView sparse_past_the_end = PushView(0, 0, 0, past_the_end, 1);
  sparse_past_the_end.sparse = true;
  const std::string descending = Sparse({2, 1}, {1, 1});
  PushRequestView sparse_descending = PushView(0, 0, 0, descending, 1);
  sparse_descending.sparse = true;
  std::vector<Case> cases = {
      {"unknown partition", PushView(0, 0, 7, good, 1), absl::StatusCode::kInvalidArgument},
      {"short data", PushView(0, 0, 0, Bytes({1, 1, 1}), 1), absl::StatusCode::kInvalidArgument},
      {"odd byte length", PushView(0, 0, 0, good + "x", 1), absl::StatusCode::kInvalidArgument},
      {"wrong dtype", wrong_dtype, absl::StatusCode::kInvalidArgument},
      {"bf16 values of float32's length", bf16_of_float32_length, absl::StatusCode::kInvalidArgument},
      {"sparse position past the end", sparse_past_the_end, absl::StatusCode::kInvalidArgument},
      {"sparse positions descending", sparse_descending, absl::StatusCode::kInvalidArgument},
      {"negative examples", PushView(0, 0, 0, good, -1), absl::StatusCode::kInvalidArgument},
      {"rank outside group", PushView(2, 0, 0, good, 1), absl::StatusCode::kInvalidArgument},
      {"negative rank", PushView(-1, 0, 0, good, 1), absl::StatusCode::kInvalidArgument},
      {"future step", PushView(0, 5, 0, good, 1), absl::StatusCode::kOutOfRange},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ps_.Push(c.view).status().code(), c.code) << c.what;
  }
  // A duplicate is refused and not counted: rank 1's single push must not complete the step. It
  // carries other values and another example count, so that summing it would show.
  ASSERT_TRUE(ps_.Push(PushView(0, 0, 0, good, 1)).ok());
  auto dup = ps_.Push(PushView(0, 0, 0, Bytes({9, 9, 9, 9}), 3));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  EXPECT_EQ(Weights(ps_), before);
  ASSERT_EQ(*ps_.Push(PushView(1, 0, 0, good, 1)), true);
  // 2 pushes of ones over 2 examples: each weight moves by exactly 1 (with the duplicate summed
  // it would be (1 + 9 + 1) / 5).
  EXPECT_EQ(Weights(ps_)[0], before[0] - 1);
  // A retry after its step completed (the first reply was lost) is still a duplicate.
  const std::vector<float> after = Weights(ps_);
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, Bytes({9, 9, 9, 9}), 3)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Weights(ps_), after);
  EXPECT_EQ(ps_.Status().duplicate_pushes, 2u);
}

TEST_F(ParameterServerTest, PushesInEveryWireFormatAreSummedAsTheirFloat32Values) {
  JoinBoth();
  // Step 0 of partition 0 (4 floats): rank 0 sends bf16, rank 1 sends top-k's sparse layout in
  // fp16; every value is exact in both. Then step 1: fp16 dense from rank 0, sparse bf16 (one
  // value) from rank 1.
  const std::string bf16_bytes = Halves(WireDType::kBfloat16, {0.5f, -1.5f, 2.0f, 3.0f});
  PushRequestView bf16 = PushView(0, 0, 0, bf16_bytes, 1);
  bf16.dtype = WireDType::kBfloat16;
  std::string sparse16(8, '\0');
  const uint32_t positions[] = {1, 3};
  std::memcpy(sparse16.data(), positions, 8);
  sparse16 += Halves(WireDType::kFloat16, {0.25f, -4.0f});
  PushRequestView top_k = PushView(1, 0, 0, sparse16, 1);
  top_k.dtype = WireDType::kFloat16;
  top_k.sparse = true;
  ASSERT_EQ(*ps_.Push(bf16), false);
  ASSERT_EQ(*ps_.Push(top_k), true);
  // lr 1 on the sum over 2 examples: w -= [0.5, -1.25, 2, -1] / 2.
  EXPECT_EQ(Weights(ps_), (std::vector<float>{0.75f, 2.625f, 2.0f, 4.5f, 10, 20}));
  const std::string fp16_bytes = Halves(WireDType::kFloat16, {1, 1, 1, 1});
  PushRequestView fp16 = PushView(0, 1, 0, fp16_bytes, 1);
  fp16.dtype = WireDType::kFloat16;
  std::string one(4, '\0');  // position 0
  one += Halves(WireDType::kBfloat16, {2});
  PushRequestView sparse_bf16 = PushView(1, 1, 0, one, 1);
  sparse_bf16.dtype = WireDType::kBfloat16;
  sparse_bf16.sparse = true;
  ASSERT_EQ(*ps_.Push(fp16), false);
  ASSERT_EQ(*ps_.Push(sparse_bf16), true);
  EXPECT_EQ(Weights(ps_), (std::vector<float>{-0.75f, 2.125f, 1.5f, 4.0f, 10, 20}));
  // What came, as it came: 8 + 12 + 8 + 6 bytes.
  EXPECT_EQ(ps_.Status().bytes_in, 34u);
}

TEST_F(ParameterServerTest, PushBeforeJoinIsRefused) {
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, Bytes({1, 1, 1, 1}), 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
  auto not_joined = ps_.Push(PushView(1, 0, 0, Bytes({1, 1, 1, 1}), 1));
  EXPECT_EQ(not_joined.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(not_joined.status().message().find("Join again"), absl::string_view::npos);
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
  ps_.Pull(0, 0, 0, 1, pull);
  ps_.Tick(absl::Now());
  EXPECT_FALSE(pull->answered());
  ps_.Tick(absl::Now() + absl::Seconds(31));
  absl::Status s = pull->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("waits for pushes from rank 1"), absl::string_view::npos) << s;
}

TEST_F(ParameterServerTest, PullTooFarAheadAndShutdownAnswerAtOnce) {
  JoinBoth();
  auto far = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 0, 5, far);
  EXPECT_EQ(far->Wait().code(), absl::StatusCode::kOutOfRange);
  auto parked = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 1, 1, parked);
  ps_.Shutdown();
  EXPECT_EQ(parked->Wait().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ParameterServerTest, CancelledCallIsDroppedWhenTheStepCompletes) {
  JoinBoth();
  auto pull = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 0, 1, pull);
  ASSERT_TRUE(pull->Claim());  // the client cancelled: the edge claimed it first
  ASSERT_TRUE(ps_.Push(PushView(0, 0, 0, Bytes({1, 1, 1, 1}), 1)).ok());
  ASSERT_TRUE(ps_.Push(PushView(1, 0, 0, Bytes({1, 1, 1, 1}), 1)).ok());
  EXPECT_FALSE(pull->answered());
}

// Calls answered elsewhere while parked (their clients went away) are forgotten as the lot grows:
// a caller that parks and cancels over and over, while the counter stands, keeps it bounded by
// twice what is really parked.
TEST(ParkingLotTest, ForgetsCallsAnsweredElsewhereAsItGrows) {
  ParkingLot lot;
  std::vector<std::shared_ptr<FakeCall>> waiting;
  for (int i = 0; i < 10; ++i) {
    waiting.push_back(std::make_shared<FakeCall>());
    lot.Park(waiting.back(), 1, absl::InfiniteFuture());
  }
  for (int i = 0; i < 10000; ++i) {
    auto gone = std::make_shared<FakeCall>();
    lot.Park(gone, 1, absl::InfiniteFuture());
    ASSERT_TRUE(gone->Claim());
    EXPECT_LE(lot.size(), 40u);
  }
  // The ten still waiting are answered when the counter moves.
  CallsToFinish out;
  lot.Release(1, []() -> const Snapshot& { static const Snapshot none; return none; }, out);
  EXPECT_EQ(out.size(), 10u);
}

}  // namespace
}  // namespace summa::server

namespace summa::server {
namespace {

std::string Floats4(float v) {
  const std::vector<float> f(4, v);
  return std::string(reinterpret_cast<const char*>(f.data()), 16);
}

// One tensor of 4 floats in one partition, 2 workers, lr 1.
class MembershipTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParameterServer> Make(ServerOptions o) {
    o.world_size = 2;
    o.optimizer.learning_rate = 1.0;
    o.lease = absl::Seconds(1);
    o.clock = &clock_;
    o.require_sessions = false;
    auto ps = std::make_unique<ParameterServer>(o);
    for (int rank : {0, 1}) {
      JoinRequestView v;
      v.rank = rank;
      v.world_size = 2;
      v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
      EXPECT_TRUE(ps->Join(v).ok());
    }
    return ps;
  }
  PushRequestView Push(int rank, uint64_t step, const std::string& data, int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.data = data;
    v.num_examples = examples;
    return v;
  }
  JoinRequestView Rejoin(int rank) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view()}};
    return v;
  }
  const std::string zeros_ = Floats4(0);
  const std::string twos_ = Floats4(2);
  FakeClock clock_;
};

TEST_F(MembershipTest, ANewerJoinFencesTheOlderProcessOfItsRank) {
  ServerOptions o;
  o.world_size = 1;
  o.optimizer.learning_rate = 1.0;
  o.clock = &clock_;
  ParameterServer ps(o);  // sessions required: the default
  JoinRequestView first;
  first.rank = 0;
  first.world_size = 1;
  first.peer = "ipv4:10.0.0.1:1111";
  first.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
  auto a = ps.Join(first);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->session, 0u);
  PushRequestView push = Push(0, 0, twos_, 2);
  push.session = a->session;
  ASSERT_TRUE(ps.Push(push).ok());
  // No session: refused, saying what to do.
  PushRequestView bare = Push(0, 1, twos_, 2);
  absl::Status none = ps.Push(bare).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("carries no session"), absl::string_view::npos) << none;
  // A second process joins as rank 0: the first one's session is fenced.
  JoinRequestView second = first;
  second.peer = "ipv4:10.0.0.2:2222";
  second.params[0].data = absl::string_view();
  auto b = ps.Join(second);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(b->session, a->session);
  PushRequestView stale = Push(0, 1, twos_, 2);
  stale.session = a->session;
  absl::Status fenced = ps.Push(stale).status();
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fenced.message().find("rank 0 is held by a newer process"), absl::string_view::npos) << fenced;
  EXPECT_NE(fenced.message().find("ipv4:10.0.0.2:2222"), absl::string_view::npos) << fenced;
  EXPECT_EQ(ps.Heartbeat(0, a->session).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ps.Leave(0, a->session).code(), absl::StatusCode::kFailedPrecondition);
  auto pull = std::make_shared<FakeCall>();
  ps.Pull(0, a->session, 0, 0, pull);
  EXPECT_EQ(pull->Wait().code(), absl::StatusCode::kFailedPrecondition);
  // Nothing the fenced process sent was counted: one step, from its first push.
  EXPECT_EQ(ps.Status().version, 1u);
  EXPECT_EQ(Weights(ps), std::vector<float>(4, -1.0f));  // 0 - lr 1 x (2 / 2 examples)
  // The newer process goes on.
  PushRequestView fresh = Push(0, 1, twos_, 2);
  fresh.session = b->session;
  ASSERT_TRUE(ps.Push(fresh).ok());
  EXPECT_EQ(ps.Status().version, 2u);
  EXPECT_TRUE(ps.Heartbeat(0, b->session).ok());
}

TEST_F(MembershipTest, ShrinkDropsALapsedMemberAndFinishesTheStepWithoutIt) {
  ServerOptions o;
  o.require_sessions = false;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  auto ps = Make(o);
  auto pull = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), pull);
  EXPECT_FALSE(pull->answered());
  // Rank 0 keeps calling; rank 1 goes silent past its 1 s lease.
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(ps->Heartbeat(0, 0).ok());
  clock_.Advance(absl::Milliseconds(500));
  ps->Tick(clock_.Now());
  ASSERT_TRUE(pull->Wait().ok());
  // The step completed with rank 0's push alone, divided by its 2 examples: w = 0 - 2/2.
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));
  EXPECT_EQ(ps->LiveRanks(), std::vector<int>{0});
  auto refused = ps->Push(Push(1, 1, twos_, 2));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dropped"), absl::string_view::npos) << refused.status();
}

// The membership view moves on when a rank leaves. A push stamped with another view than the
// server's is refused (ABORTED, naming both views) and counted, and changes nothing; stamped with
// the current view, or not stamped at all (a client before views), it is taken.
TEST_F(MembershipTest, APushStampedWithAnotherViewIsRefusedNamingBothViews) {
  ServerOptions o;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  auto ps = Make(o);
  ASSERT_EQ(ps->view(), 0u);
  PushRequestView first = Push(0, 0, twos_, 2);
  first.view = 0;
  ASSERT_TRUE(ps->Push(first).ok());
  ASSERT_TRUE(ps->Leave(1, 0).ok());  // step 0 completes with rank 0's push alone
  ASSERT_EQ(ps->view(), 1u);
  ASSERT_EQ(ps->Status().version, 1u);
  PushRequestView stale = Push(0, 1, twos_, 2);
  stale.view = 0;
  const absl::Status refused = ps->Push(stale).status();
  EXPECT_TRUE(IsStaleView(refused)) << refused;
  EXPECT_NE(refused.message().find("stamped with view 0, and this server is at view 1"), absl::string_view::npos)
      << refused;
  PushRequestView ahead = Push(0, 1, twos_, 2);
  ahead.view = 2;  // a follower's view may go back; any other view is refused
  EXPECT_TRUE(IsStaleView(ps->Push(ahead).status()));
  EXPECT_EQ(ps->Status().stale_view_pushes, 2u);
  EXPECT_EQ(ps->Status().version, 1u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1.0f));
  PushRequestView current = Push(0, 1, twos_, 2);
  current.view = 1;
  ASSERT_TRUE(ps->Push(current).ok());
  EXPECT_EQ(ps->Status().version, 2u);
  ASSERT_TRUE(ps->Push(Push(0, 2, twos_, 2)).ok());  // not stamped
  EXPECT_EQ(ps->Status().version, 3u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -3.0f));
  EXPECT_EQ(ps->Status().stale_view_pushes, 2u);
}

TEST_F(MembershipTest, WaitKeepsTheStepForARejoinAndEndsTheJobPastTheDeadline) {
  ServerOptions o;
  o.require_sessions = false;
  o.on_worker_loss = OnWorkerLoss::kWait;
  o.rejoin_deadline = absl::Seconds(30);
  auto ps = Make(o);
  auto pull = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), pull);
  clock_.Advance(absl::Seconds(2));
  ps->Tick(clock_.Now());  // rank 1 lapses; rank 0 too, but it is waiting on us
  EXPECT_FALSE(pull->answered());
  StatusSnapshot s = ps->Status();
  EXPECT_EQ(s.members[1].state, MemberState::kLapsed);
  // Rank 1 comes back (a restarted process) and pushes: the step completes with both pushes.
  auto rejoined = ps->Join(Rejoin(1));
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->next_step, 0u);
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());
  ASSERT_TRUE(pull->Wait().ok());
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));  // (2 + 2) / 4

  // Lost again, and not back within the rejoin deadline: the job ends, parked calls with it.
  auto parked = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 1, twos_, 2), parked);
  clock_.Advance(absl::Seconds(2));
  ps->Tick(clock_.Now());
  EXPECT_FALSE(parked->answered());
  clock_.Advance(absl::Seconds(29));
  ps->Tick(clock_.Now());
  EXPECT_FALSE(parked->answered()) << "the rejoin deadline has not passed";
  clock_.Advance(absl::Seconds(2));
  ps->Tick(clock_.Now());
  absl::Status ended = parked->Wait();
  EXPECT_EQ(ended.code(), absl::StatusCode::kAborted);
  EXPECT_NE(ended.message().find("did not rejoin"), absl::string_view::npos) << ended;
  EXPECT_EQ(ps->Push(Push(0, 1, twos_, 2)).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(ps->job_error().empty());
}

// Shard 0's view reaches a follower at once, often before a leaving rank's Leave does: that
// Leave, from the rank's own session, is OK (no other session's is); and the follower knows
// which shard 0 process it follows (its reports say so).
TEST_F(MembershipTest, ALeaveThatArrivesAfterShardZerosViewIsOk) {
  Membership m(2, OnWorkerLoss::kShrink, absl::Seconds(1), absl::Seconds(5), &clock_);
  m.set_follower(true);
  absl::StatusOr<Admitted> admitted = m.Admit(1, "peer", "");
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(m.followed_incarnation(), 0u);
  m.Follow(77, 1, {1}, "");
  EXPECT_EQ(m.followed_incarnation(), 77u);
  ASSERT_TRUE(m.excluded(1));
  EXPECT_EQ(m.Leave(1, admitted->session + 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m.Leave(1, admitted->session).ok());
  EXPECT_TRUE(m.excluded(1));
  // Ranks outside the group are refused as before (and never looked up).
  for (int rank : {-1, 2, 2147483647}) {
    EXPECT_EQ(m.Leave(rank, admitted->session).code(), absl::StatusCode::kInvalidArgument) << rank;
  }
}

TEST_F(MembershipTest, AShardFollowingShardZeroDropsAndEndsOnlyInShardZerosView) {
  // Shard 0 under shrink: rank 1's lease lapses, it is dropped, and the view moves on.
  ServerOptions zero_options;
  zero_options.require_sessions = false;
  zero_options.on_worker_loss = OnWorkerLoss::kShrink;
  auto zero = Make(zero_options);
  ServerOptions follower_options = zero_options;
  follower_options.follower = true;
  auto follower = Make(follower_options);
  EXPECT_EQ(zero->Status().view, 0u);
  auto pull = std::make_shared<FakeCall>();
  follower->PushPull(Push(0, 0, twos_, 2), pull);
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(zero->Heartbeat(0, 0).ok());
  ASSERT_TRUE(follower->Heartbeat(0, 0).ok());
  clock_.Advance(absl::Milliseconds(500));
  zero->Tick(clock_.Now());
  follower->Tick(clock_.Now());
  EXPECT_EQ(zero->LiveRanks(), std::vector<int>{0});
  EXPECT_EQ(zero->Status().view, 1u);
  // The follower's own lease only lapses: the step still waits for rank 1.
  EXPECT_EQ(follower->LiveRanks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(follower->Status().members[1].state, MemberState::kLapsed);
  EXPECT_FALSE(pull->answered());
  // Shard 0's view reaches it: rank 1 is dropped there too and the step completes without it.
  Membership& m = follower->membership();
  const uint64_t incarnation = zero->membership().incarnation();
  m.Follow(incarnation, zero->membership().view(), zero->membership().ExcludedRanks(), zero->job_error());
  ASSERT_TRUE(pull->Wait().ok());
  EXPECT_EQ(follower->LiveRanks(), std::vector<int>{0});
  EXPECT_EQ(follower->Status().view, 1u);
  EXPECT_EQ(Weights(*follower), std::vector<float>(4, -1));
  // An older view changes nothing; shard 0's end of the job ends it here.
  m.Follow(incarnation, 0, {0, 1}, "stale");
  EXPECT_EQ(follower->LiveRanks(), std::vector<int>{0});
  EXPECT_TRUE(follower->job_error().empty());
  // A restarted shard 0 counts from 0 again: its views are taken from then on.
  m.Follow(incarnation + 1, 0, {}, "");
  EXPECT_EQ(follower->Status().view, 0u);
  zero->membership().EndJob("rank 0 did not rejoin");
  EXPECT_EQ(zero->Status().view, 2u);
  m.Follow(incarnation, zero->membership().view(), zero->membership().ExcludedRanks(), zero->job_error());
  EXPECT_NE(follower->job_error().find("shard 0 ended the job: rank 0 did not rejoin"), std::string::npos)
      << follower->job_error();

  // Cut off from shard 0, a follower decides alone; its own exclusions do not hide shard 0's
  // later views once it follows again.
  auto alone = Make(follower_options);
  Membership& am = alone->membership();
  am.Follow(incarnation, 1, {}, "");
  am.set_follower(false);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(alone->Heartbeat(0, 0).ok());
  alone->Tick(clock_.Now());  // rank 1 is dropped here alone: the local view moves to 2
  EXPECT_EQ(alone->LiveRanks(), std::vector<int>{0});
  EXPECT_EQ(alone->Status().view, 2u);
  am.set_follower(true);
  am.Follow(incarnation, 2, {0}, "");  // shard 0's view 2 drops rank 0
  EXPECT_TRUE(alone->LiveRanks().empty()) << "shard 0's view 2 is applied, whatever the local count";
  EXPECT_EQ(alone->Status().view, 2u);

  // Under shrink, a rank that lapsed while following is dropped once the follower decides alone.
  auto lapsed = Make(follower_options);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(lapsed->Heartbeat(0, 0).ok());
  lapsed->Tick(clock_.Now());
  EXPECT_EQ(lapsed->Status().members[1].state, MemberState::kLapsed);
  lapsed->membership().set_follower(false);
  lapsed->Tick(clock_.Now());
  EXPECT_EQ(lapsed->LiveRanks(), std::vector<int>{0});
  EXPECT_TRUE(lapsed->job_error().empty());

  // Under wait, a follower's lapsed member never ends the job on its own deadline.
  follower_options.on_worker_loss = OnWorkerLoss::kWait;
  follower_options.rejoin_deadline = absl::Seconds(1);
  auto waiting = Make(follower_options);
  clock_.Advance(absl::Seconds(5));
  waiting->Tick(clock_.Now());
  clock_.Advance(absl::Seconds(5));
  waiting->Tick(clock_.Now());
  EXPECT_TRUE(waiting->job_error().empty());
}

TEST_F(MembershipTest, RetriedPushPullIsAnsweredButCountedOnce) {
  auto ps = Make(ServerOptions());
  auto first = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), first);
  // The reply to rank 0 was lost; it retries the same push.
  auto retry = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), retry);
  auto other = std::make_shared<FakeCall>();
  ps->PushPull(Push(1, 0, twos_, 2), other);
  for (auto* c : {&first, &retry, &other}) ASSERT_TRUE((*c)->Wait().ok());
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));  // not (2+2+2)/6 or (2+2+2)/4
  EXPECT_EQ(retry->values(), std::vector<float>(4, -1));
  EXPECT_EQ(ps->Status().duplicate_pushes, 1u);
}

TEST_F(MembershipTest, AsyncAppliesEachPushAloneAndRefusesRepeats) {
  ServerOptions o;
  o.require_sessions = false;
  o.mode = Mode::kAsync;
  auto ps = Make(o);
  ASSERT_EQ(*ps->Push(Push(0, 0, twos_, 2)), true);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));  // applied at once: 0 - 2/2
  EXPECT_EQ(ps->Push(Push(0, 0, twos_, 2)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ps->Push(Push(0, 5, twos_, 2)).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 1)).ok());
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -3));  // then 2/1 more
  EXPECT_EQ(ps->Status().version, 2u);
  auto pull = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 1, twos_, 2), pull);  // async never waits
  ASSERT_TRUE(pull->Wait(absl::Seconds(1)).ok());
}

TEST_F(MembershipTest, SspHoldsAWorkerThatRunsTooFarAhead) {
  ServerOptions o;
  o.require_sessions = false;
  o.mode = Mode::kSsp;
  o.staleness = 1;
  auto ps = Make(o);
  auto step0 = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), step0);
  ASSERT_TRUE(step0->Wait(absl::Seconds(1)).ok()) << "one step ahead is within the staleness";
  auto step1 = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 1, twos_, 2), step1);
  EXPECT_FALSE(step1->answered()) << "two steps ahead of rank 1 must wait";
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());
  ASSERT_TRUE(step1->Wait().ok());
  EXPECT_EQ(step1->counter(), 3u);  // three pushes applied
}

// Under shrink in ssp mode, a member whose lease lapses is dropped, and the slowest member is
// then the slowest of those left: a push-pull held back by the dropped rank's step is answered
// as it is dropped, and the survivor runs on, any number of steps past `staleness` ahead of the
// dropped rank, every push applied (each subtracts 2/2 at lr 1).
TEST_F(MembershipTest, SspUnderShrinkDropsALapsedMemberAndTheOtherRunsOnPastItsStep) {
  ServerOptions o;
  o.require_sessions = false;
  o.mode = Mode::kSsp;
  o.staleness = 1;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  auto ps = Make(o);
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());  // rank 1's last push: it pushes step 1 next
  for (uint64_t step : {0, 1}) {
    auto reply = std::make_shared<FakeCall>();
    ps->PushPull(Push(0, step, twos_, 2), reply);
    ASSERT_TRUE(reply->answered()) << "step " << step << " is within the staleness of rank 1's step 1";
    ASSERT_TRUE(reply->Wait().ok());
    EXPECT_EQ(reply->counter(), step + 2);
  }
  auto held = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 2, twos_, 2), held);
  ASSERT_FALSE(held->answered()) << "step 2 is two steps past rank 1's: it waits";
  EXPECT_EQ(ps->Status().version, 4u) << "the push itself is applied";
  // Rank 0 keeps calling; rank 1 goes silent past its 1 s lease.
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(ps->Heartbeat(0, 0).ok());
  clock_.Advance(absl::Milliseconds(500));
  ps->Tick(clock_.Now());
  ASSERT_EQ(ps->LiveRanks(), std::vector<int>{0});
  EXPECT_EQ(ps->view(), 1u);
  ASSERT_TRUE(held->answered()) << "the drop answers the push-pull the dropped rank held back";
  ASSERT_TRUE(held->Wait().ok());
  EXPECT_EQ(held->counter(), 4u);
  EXPECT_EQ(held->values(), std::vector<float>(4, -4));
  // Rank 0 runs on, up to 8 steps past rank 1's step 1, each push-pull answered at once.
  for (uint64_t step = 3; step < 10; ++step) {
    auto reply = std::make_shared<FakeCall>();
    ps->PushPull(Push(0, step, twos_, 2), reply);
    ASSERT_TRUE(reply->answered()) << "step " << step;
    ASSERT_TRUE(reply->Wait().ok());
    EXPECT_EQ(reply->counter(), step + 2);
    EXPECT_EQ(reply->values(), std::vector<float>(4, -static_cast<float>(step + 2)));
  }
  // The dropped rank's late push is refused and changes nothing.
  const absl::Status late = ps->Push(Push(1, 1, twos_, 2)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(ps->Status().version, 11u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -11));
  EXPECT_EQ(ps->Status().members[0].pushes, 10u);
}

// Under shrink in async mode, a member whose lease lapses is dropped and the other goes on:
// every one of its pushes is applied at once (version and weights count them all), and the
// dropped rank's are refused.
TEST_F(MembershipTest, AsyncUnderShrinkDropsALapsedMemberAndAppliesEveryPushOfTheOther) {
  ServerOptions o;
  o.require_sessions = false;
  o.mode = Mode::kAsync;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  auto ps = Make(o);
  ASSERT_EQ(*ps->Push(Push(1, 0, twos_, 1)), true);  // 2/1: w = -2
  ASSERT_EQ(*ps->Push(Push(0, 0, twos_, 2)), true);  // 2/2: w = -3
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_EQ(*ps->Push(Push(0, 1, twos_, 2)), true);  // rank 0's lease renewed; w = -4
  clock_.Advance(absl::Milliseconds(500));
  ps->Tick(clock_.Now());
  ASSERT_EQ(ps->LiveRanks(), std::vector<int>{0});
  EXPECT_EQ(ps->view(), 1u);
  EXPECT_EQ(ps->Status().version, 3u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -4));
  for (uint64_t step = 2; step < 8; ++step) {
    auto reply = std::make_shared<FakeCall>();
    ps->PushPull(Push(0, step, twos_, 2), reply);
    ASSERT_TRUE(reply->answered()) << "step " << step;
    ASSERT_TRUE(reply->Wait().ok());
    EXPECT_EQ(reply->counter(), step + 2);
    EXPECT_EQ(reply->values(), std::vector<float>(4, -static_cast<float>(step + 3)));  // rank 1's took 2
  }
  const absl::Status late = ps->Push(Push(1, 1, twos_, 1)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(ps->Status().version, 9u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -10));
  // A pull of the newest version is answered at once.
  auto pull = std::make_shared<FakeCall>();
  ps->Pull(0, 0, 0, 9, pull);
  ASSERT_TRUE(pull->answered());
  EXPECT_EQ(pull->counter(), 9u);
}

TEST_F(MembershipTest, CheckpointRestoresWeightsVersionAndAsksMembersToRejoin) {
  const std::string dir = std::filesystem::temp_directory_path() / ("summa-ps-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.require_sessions = false;
  o.checkpoint_dir = dir;
  auto ps = Make(o);
  ASSERT_TRUE(ps->Push(Push(0, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());
  EXPECT_EQ(ps->Status().checkpoint.version, 1u);
  ServerOptions o2 = o;
  o2.world_size = 2;
  o2.optimizer.learning_rate = 1.0;
  ParameterServer again(o2);
  ASSERT_TRUE(RestoreNewest(again, dir).ok());
  EXPECT_EQ(Weights(again), Weights(*ps));
  EXPECT_EQ(again.Status().version, 1u);
  EXPECT_EQ(again.Push(Push(0, 1, twos_, 2)).status().code(), absl::StatusCode::kNotFound);
  ServerOptions other = o2;
  other.world_size = 3;
  ParameterServer mismatched(other);
  EXPECT_EQ(RestoreNewest(mismatched, dir).code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

// The group is part of the job's state (server/core/group_view.h): a checkpoint written after a
// rank was dropped restores into a server that leaves that rank out, at the view it had reached,
// so the next step completes with the ranks left instead of waiting for one that is gone.
TEST_F(MembershipTest, ACheckpointKeepsTheGroupAndARestoredServerStepsWithoutTheDroppedRank) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-ps-group-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.require_sessions = false;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  o.checkpoint_dir = dir;
  auto ps = Make(o);
  // Rank 1 goes silent past its lease and is dropped; rank 0 completes step 0 alone.
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(ps->Heartbeat(0, 0).ok());
  clock_.Advance(absl::Milliseconds(500));
  ps->Tick(clock_.Now());
  const GroupView dropped = ps->membership().group();
  ASSERT_EQ(dropped.ranks, std::vector<int>{0});
  ASSERT_GT(dropped.view, 0u);
  ASSERT_TRUE(ps->Push(Push(0, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());

  ServerOptions o2 = o;
  o2.world_size = 2;
  o2.optimizer.learning_rate = 1.0;
  o2.clock = &clock_;
  ParameterServer again(o2);
  ASSERT_TRUE(RestoreNewest(again, dir).ok());
  EXPECT_EQ(again.membership().group(), dropped);
  EXPECT_EQ(again.LiveRanks(), std::vector<int>{0});
  // Rank 1 cannot come back; rank 0 rejoins and its step 1 completes alone.
  EXPECT_EQ(again.Join(Rejoin(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(again.Join(Rejoin(0)).ok());
  auto pull = std::make_shared<FakeCall>();
  again.PushPull(Push(0, 1, twos_, 2), pull);
  ASSERT_TRUE(pull->Wait().ok());
  EXPECT_EQ(pull->counter(), 2u);
  EXPECT_EQ(Weights(again), std::vector<float>(4, -2));
  std::filesystem::remove_all(dir);
}

TEST_F(MembershipTest, PushPullRetriedAfterItsStepCompletedGetsTheNextWeights) {
  auto ps = Make(ServerOptions());
  auto first = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, twos_, 2), first);
  auto other = std::make_shared<FakeCall>();
  ps->PushPull(Push(1, 0, twos_, 2), other);
  ASSERT_TRUE(first->Wait().ok());
  // The reply to rank 0 was lost after step 0 completed; it retries with other values.
  auto retry = std::make_shared<FakeCall>();
  ps->PushPull(Push(0, 0, Floats4(50), 1), retry);
  ASSERT_TRUE(retry->Wait().ok()) << "a retried push is answered, not refused";
  EXPECT_EQ(retry->counter(), 1u);  // the weights of step + 1
  EXPECT_EQ(retry->values(), std::vector<float>(4, -1));
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));
  EXPECT_EQ(ps->Status().duplicate_pushes, 1u);
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

TEST_F(MembershipTest, AShardHoldsItsPartitionsAndRefusesTheOthersByName) {
  ServerOptions o;
  o.partition_bytes = 8;  // two partitions of two floats: partition 0 on shard 0, 1 on shard 1
  o.shards = 2;
  o.shard = 1;
  auto ps = Make(o);
  auto joined = ps->Join(Rejoin(0));
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->partitions.size(), 1u);
  EXPECT_EQ(joined->partitions[0].id, 1u);
  EXPECT_EQ(joined->partitions[0].offset, 2);
  const std::vector<float> twos = {2, 2};
  const std::string bytes(reinterpret_cast<const char*>(twos.data()), 8);
  auto refused = ps->Push(Push(0, 0, bytes, 1));
  EXPECT_EQ(refused.status().message(), "partition 0 is held by shard 0, not this one (shard 1 of 2)");
  PushRequestView mine = Push(0, 0, bytes, 1);
  mine.partition = 1;
  EXPECT_TRUE(ps->Push(mine).ok());
  EXPECT_EQ(ps->Status().partition_count, 1);
  // Its first partition reports the job's steps and rate (partition 0 is another shard's).
  EXPECT_EQ(ps->Status().learning_rate, 1.0);
}

TEST_F(MembershipTest, AModelOfFewerPartitionsThanShardsIsRefused) {
  ServerOptions o;
  o.world_size = 2;
  o.shards = 2;
  o.clock = &clock_;
  ParameterServer ps(o);
  JoinRequestView v;
  v.rank = 0;
  v.world_size = 2;
  v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
  auto joined = ps.Join(v);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(joined.status().message().find("2 shards need at least 2"), absl::string_view::npos) << joined.status();
}

TEST(ShardOptionsTest, AShardComesFromItsFlagsOrItsPodsOrdinal) {
  EXPECT_EQ(*ShardFromHostname("summa-server-1"), 1);
  EXPECT_EQ(*ShardFromHostname("summa-server-12"), 12);
  for (const char* bad : {"summa-server", "summa-server-x", "", "summa-server-1a"}) {
    const absl::StatusOr<int> refused = ShardFromHostname(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find(absl::StrCat("'", bad, "'")), absl::string_view::npos) << refused.status();
  }
  EXPECT_FALSE(ShardFromHostname(nullptr).ok());
  ServerOptions o;
  o.shards = 2;
  o.shard = 1;
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (auto [shard, shards] : {std::pair{2, 2}, {-1, 2}, {0, 0}}) {
    o.shard = shard;
    o.shards = shards;
    const absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shard << " of " << shards;
    EXPECT_NE(s.message().find(absl::StrCat("shard ", shard, " of ", shards)), absl::string_view::npos) << s;
  }
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

TEST_F(MembershipTest, LeaseLapsesOnlyWhenTheClockPassesIt) {
  ServerOptions o;
  o.require_sessions = false;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  auto ps = Make(o);
  clock_.Advance(absl::Milliseconds(999));
  ps->Tick(clock_.Now());
  EXPECT_EQ(ps->LiveRanks(), (std::vector<int>{0, 1}));
  clock_.Advance(absl::Milliseconds(1));
  ps->Tick(clock_.Now());
  EXPECT_EQ(ps->LiveRanks(), std::vector<int>{});
}

// Two partitions of 4 floats each, async, Adam: a checkpoint taken while rank 0 has pushed step 1
// to partition 0 only. After a restore, rank 0 resumes at step 1 and pushes it to both: partition
// 0 must take it as a duplicate, so the weights equal an undisturbed run's.
TEST(CheckpointConsistencyTest, AsyncRestoreAppliesNoPushTwice) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-async-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  FakeClock clock;
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 1;
  o.mode = Mode::kAsync;
  o.optimizer.name = "adam";
  o.optimizer.learning_rate = 0.1;
  o.partition_bytes = 16;
  o.checkpoint_dir = dir;
  o.clock = &clock;
  const std::vector<float> init = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string init_bytes(reinterpret_cast<const char*>(init.data()), 32);
  auto join = [&](ParameterServer& ps) {
    JoinRequestView v;
    v.rank = 0;
    v.world_size = 1;
    v.params = {{{"w", DType::kFloat32, {8}}, init_bytes}};
    return ps.Join(v);
  };
  auto push = [&](ParameterServer& ps, uint64_t step, uint32_t partition) {
    std::vector<float> g(4, static_cast<float>(step + 1) * (partition + 1));
    PushRequestView v;
    v.rank = 0;
    v.step = step;
    v.partition = partition;
    v.num_examples = 1;
    const std::string bytes(reinterpret_cast<const char*>(g.data()), 16);
    v.data = bytes;
    return ps.Push(v);
  };
  ParameterServer undisturbed(o);
  ASSERT_TRUE(join(undisturbed).ok());
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint32_t p : {0u, 1u}) ASSERT_TRUE(push(undisturbed, step, p).ok());
  }

  {
    ParameterServer before(o);
    ASSERT_TRUE(join(before).ok());
    ASSERT_TRUE(push(before, 0, 0).ok());
    ASSERT_TRUE(push(before, 0, 1).ok());
    ASSERT_TRUE(push(before, 1, 0).ok());  // partition 1 has not seen step 1 yet
    ASSERT_TRUE(before.MaybeCheckpoint(true).ok());
  }
  ParameterServer after(o);
  ASSERT_TRUE(RestoreNewest(after, dir).ok());
  auto joined = join(after);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->next_step, 1u);
  EXPECT_EQ(push(after, 1, 0).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(push(after, 1, 1).ok());
  for (uint32_t p : {0u, 1u}) ASSERT_TRUE(push(after, 2, p).ok());
  EXPECT_EQ(Weights(after), Weights(undisturbed));
  EXPECT_EQ(after.Status().version, undisturbed.Status().version);

  // The checkpoint belongs to an async Adam job: a sync job, or an SGD one, refuses it.
  ServerOptions sync = o;
  sync.mode = Mode::kSync;
  ParameterServer sync_server(sync);
  absl::Status refused = RestoreNewest(sync_server, dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("async mode"), absl::string_view::npos) << refused;
  ServerOptions sgd = o;
  sgd.optimizer.name = "sgd";
  ParameterServer sgd_server(sgd);
  refused = RestoreNewest(sgd_server, dir);
  EXPECT_NE(refused.message().find("optimizer sgd"), absl::string_view::npos) << refused;
  std::filesystem::remove_all(dir);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The one checkpoint file in `dir`.
std::string OnlyFile(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0];
}

// Header and partitions of a checkpoint file, each as protobuf encodes it.
std::vector<std::string> Records(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  std::vector<std::string> records = {(*reader)->header().SerializeAsString()};
  summa::v1::PartitionCheckpoint p;
  while (true) {
    auto more = (*reader)->Next(&p);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) return records;
    records.push_back(p.SerializeAsString());
  }
}

// Async Adam, three partitions at three versions, checkpointed a partition at a time and
// restored the same way: weights, state slots, versions, updates and pushes seen come back
// exactly (a checkpoint of the restored server is the same file), from a streamed file or from
// one written whole by the first releases; a file found corrupt after every partition was read
// leaves no model behind.
TEST(CheckpointConsistencyTest, AStreamedRestoreIsExact) {
  const std::string root =
      std::filesystem::temp_directory_path() / ("summa-stream-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  FakeClock clock;
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 1;
  o.mode = Mode::kAsync;
  o.optimizer.name = "adam";
  o.optimizer.learning_rate = 0.1;
  o.partition_bytes = 16;
  o.checkpoint_dir = root + "/first";
  o.clock = &clock;
  const std::vector<float> init = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::string init_bytes = Bytes(init);
  auto join = [&](ParameterServer& ps) {
    JoinRequestView v;
    v.rank = 0;
    v.world_size = 1;
    v.params = {{{"w", DType::kFloat32, {10}}, init_bytes}};
    return ps.Join(v).status();
  };
  auto push = [&](ParameterServer& ps, uint64_t step, uint32_t partition) {
    std::vector<float> g(partition == 2 ? 2 : 4, 0.5f + step - partition);
    PushRequestView v;
    v.rank = 0;
    v.step = step;
    v.partition = partition;
    v.num_examples = 1;
    const std::string bytes = Bytes(g);
    v.data = bytes;
    return ps.Push(v).status();
  };
  ParameterServer before(o);
  ASSERT_TRUE(join(before).ok());
  for (uint32_t p : {0u, 1u, 2u}) ASSERT_TRUE(push(before, 0, p).ok());
  for (uint32_t p : {0u, 2u}) ASSERT_TRUE(push(before, 1, p).ok());
  ASSERT_TRUE(push(before, 2, 0).ok());  // partitions at versions 3, 1, 2
  ASSERT_TRUE(before.MaybeCheckpoint(true).ok());
  const std::string written = OnlyFile(o.checkpoint_dir);
  EXPECT_EQ(before.Status().checkpoint.version, 1u);

  ServerOptions again = o;
  again.checkpoint_dir = root + "/again";
  ParameterServer after(again);
  ASSERT_TRUE(RestoreNewest(after, o.checkpoint_dir).ok());
  EXPECT_EQ(Weights(after), Weights(before));
  EXPECT_EQ(after.Status().version, 1u);
  EXPECT_EQ(after.Status().checkpoint.version, 1u);
  ASSERT_TRUE(after.MaybeCheckpoint(true).ok());
  const std::vector<std::string> records = Records(written);
  ASSERT_EQ(records.size(), 4u);  // the header and three partitions
  EXPECT_EQ(Records(OnlyFile(again.checkpoint_dir)), records);

  // The streamed body is one Checkpoint message: parsed whole, it is the records' header with
  // their partitions.
  summa::v1::Checkpoint whole;
  ASSERT_TRUE(whole.ParseFromString(records[0]));
  for (size_t i = 1; i < records.size(); ++i) ASSERT_TRUE(whole.add_partitions()->ParseFromString(records[i]));
  const std::string streamed = FileBytes(written);
  ASSERT_GT(streamed.size(), 20u);
  summa::v1::Checkpoint parsed;
  ASSERT_TRUE(parsed.ParseFromString(streamed.substr(16, streamed.size() - 20)));
  EXPECT_EQ(parsed.SerializeAsString(), whole.SerializeAsString());
  // The first releases wrote the whole message at once, without a group; such a file restores
  // the same.
  ASSERT_TRUE(whole.has_group());
  whole.clear_group();
  std::string body;
  ASSERT_TRUE(whole.SerializeToString(&body));
  std::string old_style("SUMMACK1");
  for (int i = 0; i < 8; ++i) old_style.push_back(static_cast<char>(uint64_t{body.size()} >> (8 * i)));
  old_style += body;
  const uint32_t crc = crc32(0L, reinterpret_cast<const Bytef*>(old_style.data()), old_style.size());
  for (int i = 0; i < 4; ++i) old_style.push_back(static_cast<char>(crc >> (8 * i)));
  std::filesystem::create_directories(root + "/old");
  std::ofstream(root + "/old/ckpt-000000000001.summa", std::ios::binary) << old_style;
  ServerOptions from_old = o;
  from_old.checkpoint_dir = root + "/old-again";
  ParameterServer restored_old(from_old);
  ASSERT_TRUE(RestoreNewest(restored_old, root + "/old").ok());
  ASSERT_TRUE(restored_old.MaybeCheckpoint(true).ok());
  EXPECT_EQ(Records(OnlyFile(from_old.checkpoint_dir)), records);

  // A byte of the last partition's weights flipped: every partition parses and decodes, and the
  // checksum fails at the end. The restore takes nothing; the older whole file is restored.
  std::string corrupt = FileBytes(written);
  const std::vector<float> weights = Weights(before);
  const size_t at = corrupt.rfind(Bytes({weights[8], weights[9]}));
  ASSERT_NE(at, std::string::npos);
  corrupt[at] ^= 1;
  std::filesystem::create_directories(root + "/corrupt");
  const std::string corrupt_path = root + "/corrupt/ckpt-000000000002.summa";
  std::ofstream(corrupt_path, std::ios::binary) << corrupt;
  ParameterServer fresh(again);
  auto reader = CheckpointReader::Open(corrupt_path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::Status refused = fresh.Restore((*reader)->header(), **reader);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("checksum mismatch"), absl::string_view::npos) << refused;
  EXPECT_FALSE(fresh.Status().model_defined);
  std::filesystem::copy_file(written, root + "/corrupt/ckpt-000000000001.summa");
  std::vector<std::string> warnings;
  ASSERT_TRUE(RestoreNewest(fresh, root + "/corrupt", &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ckpt-000000000002.summa: checksum mismatch"), std::string::npos) << warnings[0];
  EXPECT_EQ(Weights(fresh), Weights(before));
  std::filesystem::remove_all(root);
}

// Momentum lives in the checkpoint: a sync job stopped after 2 steps and restored goes on as if
// never stopped, bit for bit (without the momentum buffer it would not).
TEST(CheckpointConsistencyTest, MomentumStateSurvivesARestore) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-momentum-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 1;
  o.optimizer.momentum = 0.9;
  o.optimizer.learning_rate = 0.5;
  o.partition_bytes = 8;
  o.checkpoint_dir = dir;
  const std::vector<float> init = {1, 2, 3};
  const std::string init_bytes(reinterpret_cast<const char*>(init.data()), 12);
  auto join = [&](ParameterServer& ps) {
    JoinRequestView v;
    v.rank = 0;
    v.world_size = 1;
    v.params = {{{"w", DType::kFloat32, {3}}, init_bytes}};
    return ps.Join(v).status();
  };
  auto step = [&](ParameterServer& ps, uint64_t s) {
    for (uint32_t p : {0u, 1u}) {
      std::vector<float> g(p == 0 ? 2 : 1, 1.0f + s);
      const std::string bytes(reinterpret_cast<const char*>(g.data()), g.size() * 4);
      PushRequestView v;
      v.step = s;
      v.partition = p;
      v.num_examples = 1;
      v.data = bytes;
      ASSERT_TRUE(ps.Push(v).ok());
    }
  };
  ParameterServer undisturbed(o);
  ASSERT_TRUE(join(undisturbed).ok());
  for (uint64_t s = 0; s < 4; ++s) step(undisturbed, s);
  {
    ParameterServer first(o);
    ASSERT_TRUE(join(first).ok());
    step(first, 0);
    step(first, 1);
    ASSERT_TRUE(first.MaybeCheckpoint(true).ok());
  }
  ParameterServer again(o);
  ASSERT_TRUE(RestoreNewest(again, dir).ok());
  ASSERT_TRUE(join(again).ok());
  step(again, 2);
  step(again, 3);
  EXPECT_EQ(Weights(again), Weights(undisturbed));
  std::filesystem::remove_all(dir);
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

// A pull answered in a 16-bit wire dtype as the gRPC edge answers it (service.cc's SliceOf): the
// snapshot's shared encoding, taken under the partition's lock as the call is filled; its bytes
// are kept here. With `hold`, it also keeps a reference to the snapshot (Lend) until Release, as
// gRPC does while it still sends the bytes.
class EncodedPull : public FakeCall {
 public:
  EncodedPull(WireDType dtype, bool hold = false) : dtype_(dtype), hold_(hold) {}
  ~EncodedPull() override { Release(); }
  void Fill(uint64_t counter, const Snapshot& values) override {
    FakeCall::Fill(counter, values);
    const absl::Span<const uint16_t> encoded = values.Encoded(dtype_);
    bytes_.assign(reinterpret_cast<const char*>(encoded.data()), encoded.size() * sizeof(uint16_t));
    if (hold_) lent_ = values.Lend();
  }
  int value_bytes() const override { return 2; }
  void Release() {
    if (lent_ != nullptr) Snapshot::Return(std::exchange(lent_, nullptr));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  const WireDType dtype_;
  const bool hold_;
  std::string bytes_;
  void* lent_ = nullptr;
};

// Pulls in fp16 and bf16 at successive versions, the weights changing each step, while the
// partition's snapshot buffers are reused (two in turn, a third while one reply still holds
// its buffer): every pull carries the encoding of the current weights in its own dtype, never
// an earlier version's bytes or the other dtype's. Decoded, each is the weights rounded as the
// dtype rounds them: the codec's own rounding of them, and within half a unit in the last place
// of the dtype (8 significant bits for bf16, 11 for fp16; every weight here is a normal number
// of both).
TEST(EncodedPullTest, Fp16AndBf16PullsOfEachVersionCarryThatVersionsWeightsInTheirOwnDType) {
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 1;
  o.optimizer.learning_rate = 1.0;
  ParameterServer ps(o);
  const std::vector<float> initial = {0.1f, -1.7f, 3.14159f, 1000.3f};
  const std::vector<float> gradient = {0.013f, 0.29f, -0.77f, 40.5f};
  const std::string initial_bytes(reinterpret_cast<const char*>(initial.data()), 16);
  const std::string gradient_bytes(reinterpret_cast<const char*>(gradient.data()), 16);
  JoinRequestView join;
  join.rank = 0;
  join.world_size = 1;
  join.params = {{{"w", DType::kFloat32, {4}}, initial_bytes}};
  ASSERT_TRUE(ps.Join(join).ok());
  auto encoded = [](WireDType dtype, const std::vector<float>& values) {
    std::string out(values.size() * 2, '\0');
    EncodeValues(dtype, values, out.data());
    return out;
  };
  std::map<WireDType, std::string> before;  // the previous version's encoding, per dtype
  std::shared_ptr<EncodedPull> held;
  for (uint64_t version = 0; version < 6; ++version) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    const std::vector<float> weights = Weights(ps);
    std::vector<WireDType> order = {WireDType::kFloat16, WireDType::kBfloat16};
    if (version % 2 == 1) std::swap(order[0], order[1]);  // either dtype encodes a version first
    std::map<WireDType, std::string> pulled;
    for (WireDType dtype : order) {
      const std::string expected = encoded(dtype, weights);
      ASSERT_NE(expected, before[dtype]) << "the weights must move past the dtype's rounding each step";
      for (int i = 0; i < 2; ++i) {  // the second reply of a version shares the first's encoding
        // Version 1's first fp16 reply is still being sent until version 3.
        const bool hold = version == 1 && dtype == WireDType::kFloat16 && i == 0;
        auto pull = std::make_shared<EncodedPull>(dtype, hold);
        ps.Pull(0, 0, 0, version, pull);
        ASSERT_TRUE(pull->Wait().ok());
        ASSERT_EQ(pull->counter(), version);
        ASSERT_EQ(pull->values(), weights);
        EXPECT_EQ(pull->bytes(), expected) << WireDTypeName(dtype) << " reply " << i;
        std::vector<float> decoded(weights.size());
        DecodeValues(dtype, pull->bytes().data(), absl::MakeSpan(decoded));
        const int significand_bits = dtype == WireDType::kBfloat16 ? 8 : 11;
        for (size_t k = 0; k < weights.size(); ++k) {
          const float half_ulp = std::ldexp(1.0f, std::ilogb(weights[k]) - significand_bits);
          EXPECT_LE(std::fabs(decoded[k] - weights[k]), half_ulp)
              << WireDTypeName(dtype) << " value " << k << ": " << decoded[k] << " for " << weights[k];
        }
        pulled[dtype] = pull->bytes();
        if (hold) held = pull;
      }
      before[dtype] = expected;
    }
    EXPECT_NE(pulled[WireDType::kFloat16], pulled[WireDType::kBfloat16]) << "the dtypes' bytes are their own";
    if (version == 3 && held != nullptr) {
      held->Release();
      held.reset();
    }
    PushRequestView push;
    push.step = version;
    push.num_examples = 1;
    push.data = gradient_bytes;
    ASSERT_EQ(*ps.Push(push), true);
  }
}

TEST(JoinTest, ARefusedJoinDefinesNoModel) {
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 2;
  ParameterServer ps(o);
  JoinRequestView v;
  v.rank = 7;
  v.world_size = 2;
  const std::string bytes(8, '\0');
  v.params = {{{"w", DType::kFloat32, {2}}, bytes}};
  EXPECT_EQ(ps.Join(v).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ps.Status().model_defined);
}

TEST_F(MembershipTest, SyncCheckpointTakenMidStepRestoresAndTheStepIsPushedAgain) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-midstep-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.require_sessions = false;
  o.checkpoint_dir = dir;
  auto ps = Make(o);
  ASSERT_TRUE(ps->Push(Push(0, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->Push(Push(0, 1, twos_, 2)).ok());  // step 1 in progress: its sum is not saved
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());
  ServerOptions o2 = o;
  o2.world_size = 2;
  o2.optimizer.learning_rate = 1.0;
  o2.clock = &clock_;
  ParameterServer again(o2);
  absl::Status restored = RestoreNewest(again, dir);
  ASSERT_TRUE(restored.ok()) << restored;
  for (int rank : {0, 1}) ASSERT_TRUE(again.Join(Rejoin(rank)).ok());
  ASSERT_TRUE(again.Push(Push(0, 1, twos_, 2)).ok()) << "rank 0 pushes step 1 again";
  ASSERT_EQ(*again.Push(Push(1, 1, twos_, 2)), true);
  EXPECT_EQ(Weights(again), std::vector<float>(4, -2));
  std::filesystem::remove_all(dir);
}

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

}  // namespace
}  // namespace summa::server

namespace summa::server {
namespace {

// Shard 0 of two: two ranks, four partitions of one float (two on each shard), sync SGD at rate
// 1: each step subtracts the mean of the pushed gradients, here `step + 1` everywhere, so every
// version has its own weights.
class RollBackTest : public ::testing::Test {
 protected:
  RollBackTest() {
    dir_ = std::filesystem::temp_directory_path() / ("summa-rollback-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  ~RollBackTest() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<ParameterServer> Make(int64_t every, Mode mode = Mode::kSync) {
    ServerOptions o;
    o.world_size = 2;
    o.mode = mode;
    o.optimizer.learning_rate = 1.0;
    o.partition_bytes = 4;
    o.shards = 2;
    o.checkpoint_dir = dir_;
    o.checkpoint_every = every;
    o.keep_checkpoints = 10;
    o.require_sessions = false;
    o.clock = &clock_;
    auto ps = std::make_unique<ParameterServer>(o);
    ps->OnCheckpointDue([this] { ++due_; });
    JoinAll(*ps);
    return ps;
  }
  // The checkpoint versions the last join listed.
  std::vector<uint64_t> JoinAll(ParameterServer& ps) {
    const std::string zeros = Floats4(0);  // outlives the joins that read it
    std::vector<uint64_t> kept;
    for (int rank : {0, 1}) {
      JoinRequestView v;
      v.rank = rank;
      v.world_size = 2;
      v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros)}};
      absl::StatusOr<JoinResult> joined = ps.Join(v);
      EXPECT_TRUE(joined.ok()) << joined.status();
      if (!joined.ok()) return {};
      held_.clear();
      for (const PartitionRange& p : joined->partitions) held_.push_back(p.id);
      kept = joined->checkpoint_versions;
    }
    EXPECT_EQ(held_.size(), 2u);
    return kept;
  }
  absl::Status Step(ParameterServer& ps, uint64_t step) {
    const std::string grad = Bytes({static_cast<float>(step + 1)});
    for (int rank : {0, 1}) {
      for (uint32_t partition : held_) {
        PushRequestView v;
        v.rank = rank;
        v.step = step;
        v.partition = partition;
        v.data = grad;
        v.num_examples = 1;
        if (absl::Status s = ps.Push(v).status(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  static std::vector<float> At(uint64_t version) {  // minus (1 + 2 + ... + version), two partitions
    return std::vector<float>(2, -static_cast<float>(version * (version + 1) / 2));
  }

  std::vector<uint32_t> held_;  // this shard's partitions
  std::string dir_;
  FakeClock clock_;
  int due_ = 0;
};

TEST_F(RollBackTest, SyncCheckpointsAreOfMultiplesOfTheIntervalAsTheyWereReached) {
  auto ps = Make(/*every=*/2);
  ASSERT_TRUE(Step(*ps, 0).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_TRUE(CheckpointVersions(dir_).empty()) << "version 1 is not a multiple of 2";
  ASSERT_TRUE(Step(*ps, 1).ok());
  EXPECT_EQ(due_, 1) << "told once, when both partitions held version 2";
  ASSERT_TRUE(Step(*ps, 2).ok());  // live at version 3 before the writer runs
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{2}));
  ParameterServer again(ps->options());
  std::vector<std::string> warnings;
  absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestCheckpoint(
      dir_, [&](CheckpointReader& r) { return again.Restore(r.header(), r); }, &warnings);
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ(again.Status().version, 2u);
  EXPECT_EQ(Weights(again), At(2)) << "the weights as version 2 was reached, not the live ones";
  ASSERT_TRUE(Step(*ps, 3).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(due_, 2);
  // A forced checkpoint (SIGTERM, the Checkpoint RPC) of the live version skips no multiple.
  ASSERT_TRUE(Step(*ps, 4).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());
  ASSERT_TRUE(Step(*ps, 5).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{2, 4, 5, 6}));
}

TEST_F(RollBackTest, AShardRollsBackToAnOlderCheckpointAndEveryMemberJoinsAgain) {
  auto ps = Make(/*every=*/1);
  for (uint64_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(Step(*ps, step).ok());
    ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  }
  ASSERT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{1, 2, 3, 4}));
  auto parked = std::make_shared<FakeCall>();
  ps->Pull(0, 0, held_[1], 5, parked);  // waits for step 4
  EXPECT_EQ(ps->RollBack(0, 0, 2, 3).status().code(), absl::StatusCode::kAborted) << "it is at 4, not 3";
  EXPECT_EQ(ps->RollBack(0, 0, 5, 4).status().code(), absl::StatusCode::kFailedPrecondition) << "not forward";
  absl::Status missing = ps->RollBack(0, 0, 0, 4).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.message().find("keeps 1, 2, 3, 4"), absl::string_view::npos) << missing;
  EXPECT_EQ(Weights(*ps), At(4)) << "a refused rollback changes nothing";

  absl::StatusOr<bool> rolled = ps->RollBack(0, 0, 2, 4);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_TRUE(*rolled);
  EXPECT_EQ(Weights(*ps), At(2));
  EXPECT_EQ(ps->Status().version, 2u);
  EXPECT_EQ(ps->Status().rollbacks, 1u);
  EXPECT_EQ(ps->Status().checkpoint.version, 2u);
  EXPECT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{1, 2})) << "the abandoned history is removed";
  EXPECT_EQ(parked->Wait().code(), absl::StatusCode::kNotFound) << "a parked pull is told to join again";
  EXPECT_EQ(Step(*ps, 2).code(), absl::StatusCode::kNotFound) << "every member joins again";
  EXPECT_EQ(ps->RollBack(0, 0, 2, 4).status().code(), absl::StatusCode::kNotFound) << "not a member now";

  EXPECT_EQ(JoinAll(*ps), (std::vector<uint64_t>{1, 2})) << "a join lists the checkpoints a shard keeps";
  absl::StatusOr<bool> again = ps->RollBack(0, 0, 2, 4);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again) << "a second member asking finds it done";
  EXPECT_EQ(ps->Status().rollbacks, 1u);
  for (uint64_t step = 2; step < 5; ++step) ASSERT_TRUE(Step(*ps, step).ok());
  EXPECT_EQ(Weights(*ps), At(5)) << "the steps from version 2 again, as the first time";
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(dir_), (std::vector<uint64_t>{1, 2, 5}));
}

TEST_F(RollBackTest, AShardWithPartitionsAStepApartRollsBackToItsLowestVersion) {
  auto ps = Make(/*every=*/1);
  for (uint64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(Step(*ps, step).ok());
    ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  }
  // Step 2 reaches one partition only: the shard is at 2, one of its partitions at 3.
  for (int rank : {0, 1}) {
    PushRequestView v;
    v.rank = rank;
    v.step = 2;
    v.partition = held_[0];
    const std::string grad = Bytes({3});
    v.data = grad;
    v.num_examples = 1;
    ASSERT_TRUE(ps->Push(v).ok());
  }
  EXPECT_EQ(ps->Status().version, 2u);
  absl::StatusOr<bool> rolled = ps->RollBack(0, 0, 2, 2);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_TRUE(*rolled) << "not wholly at 2: it goes back";
  EXPECT_EQ(Weights(*ps), At(2));
}

TEST_F(RollBackTest, OnlyASyncJobWithCheckpointsRollsBack) {
  auto async = Make(/*every=*/1, Mode::kAsync);
  EXPECT_EQ(async->RollBack(0, 0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  ServerOptions o = async->options();
  o.mode = Mode::kSync;
  o.checkpoint_dir.clear();
  ParameterServer none(o);
  JoinAll(none);
  absl::Status s = none.RollBack(0, 0, 0, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--checkpoint_dir"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace summa::server
