// The core's data path (server/core/parameter_server_data.cc): pushes, pulls and push-pulls, their
// checks, retries and parked calls, and pulls answered in 16-bit wire dtypes.
#include "server/core/parameter_server.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

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

}  // namespace
}  // namespace summa::server
