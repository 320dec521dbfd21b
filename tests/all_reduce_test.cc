#include "server/core/all_reduce.h"

#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

AllReduceContribution Contribution(int rank, const std::string& data, std::vector<int64_t> shape,
                                   int group = 3) {
  AllReduceContribution c;
  c.name = "grads";
  c.group_size = group;
  c.rank = rank;
  c.spec = {"t", DType::kFloat32, std::move(shape)};
  c.data = data;
  return c;
}

TEST(AllReduceHubTest, EveryMemberReceivesTheSumRoundAfterRound) {
  AllReduceHub hub(absl::Seconds(30));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<FakeCall>> calls;
    std::vector<std::string> data;
    for (int r = 0; r < 3; ++r) data.push_back(Bytes({float(r), float(10 * r + round)}));
    for (int r = 0; r < 3; ++r) {
      calls.push_back(std::make_shared<FakeCall>());
      hub.Contribute(Contribution(r, data[r], {2}), calls.back());
      EXPECT_EQ(calls[0]->answered(), r == 2);
    }
    for (auto& c : calls) {
      ASSERT_TRUE(c->Wait().ok());
      EXPECT_EQ(c->values(), (std::vector<float>{3, float(30 + 3 * round)}));
      EXPECT_EQ(c->counter(), uint64_t(round + 1));
    }
  }
  EXPECT_EQ(hub.rounds_completed(), 3u);
}

// Four callers in threads, round after round, as the gRPC edge's threads call the hub: each
// round's sum reaches everyone. The concurrency the TSan pass checks without gRPC.
TEST(AllReduceHubTest, CallersInThreadsAllReceiveEachRoundsSum) {
  AllReduceHub hub(absl::Seconds(30));
  constexpr int kRounds = 20;
  auto caller = [&hub](int rank) {
    const std::string data = Bytes({float(rank + 1), 1});
    for (int round = 0; round < kRounds; ++round) {
      auto call = std::make_shared<FakeCall>();
      hub.Contribute(Contribution(rank, data, {2}, /*group=*/4), call);
      ASSERT_TRUE(call->Wait().ok());
      EXPECT_EQ(call->values(), (std::vector<float>{10, 4}));
      EXPECT_EQ(call->counter(), uint64_t(round + 1));
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) threads.emplace_back(caller, rank);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(hub.rounds_completed(), uint64_t(kRounds));
}

TEST(AllReduceHubTest, DisagreementsAreRefusedWithoutSpoilingTheRound) {
  AllReduceHub hub(absl::Seconds(30));
  const std::string two = Bytes({1, 2});
  auto first = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(0, two, {2}), first);

  struct Case {
    const char* what;
    AllReduceContribution c;
    absl::StatusCode code;
  };
  const std::string three = Bytes({1, 2, 3});
  std::vector<Case> cases = {
      {"other shape", Contribution(1, three, {3}), absl::StatusCode::kInvalidArgument},
      {"duplicate rank", Contribution(0, two, {2}), absl::StatusCode::kAlreadyExists},
      {"rank outside group", Contribution(3, two, {2}), absl::StatusCode::kInvalidArgument},
      {"other group size", Contribution(1, two, {2}, 4), absl::StatusCode::kInvalidArgument},
      {"bytes unlike shape", Contribution(1, three, {2}), absl::StatusCode::kInvalidArgument},
  };
  for (Case& c : cases) {
    auto call = std::make_shared<FakeCall>();
    hub.Contribute(c.c, call);
    EXPECT_EQ(call->Wait().code(), c.code) << c.what;
  }
  auto second = std::make_shared<FakeCall>();
  auto third = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(1, two, {2}), second);
  hub.Contribute(Contribution(2, two, {2}), third);
  ASSERT_TRUE(first->Wait().ok());
  EXPECT_EQ(first->values(), (std::vector<float>{3, 6}));
}

TEST(AllReduceHubTest, UnfilledRoundIsAbandonedAtTheDeadline) {
  AllReduceHub hub(absl::Seconds(5));
  const std::string data = Bytes({1});
  auto call = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(1, data, {1}), call);
  hub.ExpireRounds(absl::Now());
  EXPECT_FALSE(call->answered());
  hub.ExpireRounds(absl::Now() + absl::Seconds(6));
  absl::Status s = call->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("missing ranks 0, 2"), absl::string_view::npos) << s;
  // The next round starts clean.
  std::vector<std::shared_ptr<FakeCall>> calls;
  for (int r = 0; r < 3; ++r) {
    calls.push_back(std::make_shared<FakeCall>());
    hub.Contribute(Contribution(r, data, {1}), calls.back());
  }
  ASSERT_TRUE(calls[0]->Wait().ok());
  EXPECT_EQ(calls[0]->values(), std::vector<float>{3});
}

// The epoch-end loss collective over the job's members, with a fake clock and 1 s leases.
class MemberCollectiveTest : public ::testing::Test {
 protected:
  void Start(OnWorkerLoss policy) {
    members_ = std::make_unique<Membership>(2, policy, absl::Seconds(1), absl::Seconds(30), &clock_,
                                            /*require_sessions=*/false);
    hub_ = std::make_unique<AllReduceHub>(absl::Minutes(10), &clock_, members_.get());
    members_->AddObserver([this] { hub_->OnMembershipChange(); });
    for (int r : {0, 1}) ASSERT_TRUE(members_->Admit(r, "", "").ok());
  }
  std::shared_ptr<FakeCall> Send(int rank, uint64_t round, float value) {
    data_.push_back(std::make_unique<std::string>(Bytes({value})));
    AllReduceContribution c;
    c.name = "summa.train.loss";
    c.members = true;
    c.rank = rank;
    c.round = round;
    c.spec = {"loss", DType::kFloat32, {1}};
    c.data = *data_.back();
    auto call = std::make_shared<FakeCall>();
    hub_->Contribute(c, call);
    return call;
  }
  FakeClock clock_;
  std::unique_ptr<Membership> members_;
  std::unique_ptr<AllReduceHub> hub_;
  std::vector<std::unique_ptr<std::string>> data_;
};

TEST_F(MemberCollectiveTest, ShrinkLeavesADroppedMemberOut) {
  Start(OnWorkerLoss::kShrink);
  auto mine = Send(0, 0, 5);
  ASSERT_TRUE(members_->Touch(0, 0).ok());
  clock_.Advance(absl::Milliseconds(1500));  // rank 1 silent past its lease
  ASSERT_FALSE(mine->answered());
  members_->Tick(clock_.Now());
  ASSERT_TRUE(mine->Wait().ok()) << "the round completes without the dropped member";
  EXPECT_EQ(mine->values(), std::vector<float>{5});
  EXPECT_EQ(Send(1, 1, 1)->Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(hub_->rounds_completed(), 1u);
}

TEST_F(MemberCollectiveTest, WaitHoldsTheRoundForARejoinedMemberThatCatchesUp) {
  Start(OnWorkerLoss::kWait);
  auto mine = Send(0, 0, 5);
  clock_.Advance(absl::Seconds(2));
  members_->Tick(clock_.Now());  // rank 1 lapses: waited for, as a step is
  EXPECT_FALSE(mine->answered());
  ASSERT_TRUE(members_->Admit(1, "", "").ok());  // a restarted process
  auto late = Send(1, 0, 7);
  ASSERT_TRUE(mine->Wait().ok());
  EXPECT_EQ(mine->values(), std::vector<float>{12});
  // A member that rejoins after the round completed gets its sum and adds nothing.
  auto again = Send(1, 0, 100);
  ASSERT_TRUE(again->Wait().ok());
  EXPECT_EQ(again->values(), std::vector<float>{12});
  EXPECT_EQ(hub_->rounds_completed(), 1u);
  // Round 1 is under way: a contribution to a round past it is refused.
  auto next = Send(0, 1, 1);
  EXPECT_EQ(Send(1, 3, 1)->Wait().code(), absl::StatusCode::kOutOfRange);
  // Rank 1 is lost for good; the job ends and round 1 is aborted.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(members_->Touch(0, 0).ok());
  members_->Tick(clock_.Now());
  clock_.Advance(absl::Seconds(31));
  members_->Tick(clock_.Now());
  EXPECT_EQ(next->Wait().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Send(0, 1, 1)->Wait().code(), absl::StatusCode::kAborted);
}

TEST_F(MemberCollectiveTest, AnIdleCollectiveFollowsACallerToALaterRound) {
  // A restarted server's hub starts at round 0 while the workers are at epoch 3.
  Start(OnWorkerLoss::kWait);
  auto a = Send(0, 3, 1);
  auto b = Send(1, 3, 2);
  ASSERT_TRUE(a->Wait().ok());
  EXPECT_EQ(a->values(), std::vector<float>{3});
  EXPECT_EQ(a->counter(), 4u);
  // Round 2 was never seen here: a late member gets no stale sum.
  EXPECT_EQ(Send(1, 2, 0)->Wait().code(), absl::StatusCode::kFailedPrecondition);
  // An abandoned round leaves no sum to hand out either.
  auto alone = Send(0, 4, 1);
  hub_->ExpireRounds(clock_.Now() + absl::Minutes(11));
  EXPECT_EQ(alone->Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Send(1, 3, 0)->Wait().code(), absl::StatusCode::kFailedPrecondition);
}

// Found by fuzz/all_reduce_fuzzer: a member late for a completed round was answered with that
// round's sum whatever the shape it sent, so its reply described its own tensor and carried the
// values of another shape.
TEST_F(MemberCollectiveTest, ALateMemberWhoseShapeDiffersFromTheRoundsIsRefused) {
  Start(OnWorkerLoss::kWait);
  auto a = Send(0, 0, 5);
  auto b = Send(1, 0, 7);
  ASSERT_TRUE(a->Wait().ok());
  // Round 1 under way in another shape: round 0's late members are held to round 0's.
  const std::string pair = Bytes({1, 2});
  AllReduceContribution next;
  next.name = "summa.train.loss";
  next.members = true;
  next.rank = 0;
  next.round = 1;
  next.spec = {"loss", DType::kFloat32, {2}};
  next.data = pair;
  auto pending = std::make_shared<FakeCall>();
  hub_->Contribute(next, pending);
  AllReduceContribution late = next;
  late.rank = 1;
  late.round = 0;
  auto refused = std::make_shared<FakeCall>();
  hub_->Contribute(late, refused);
  const absl::Status s = refused->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("round 0 reduced shape [1]; rank 1 sent [2]"), absl::string_view::npos) << s;
  auto again = Send(1, 0, 100);
  ASSERT_TRUE(again->Wait().ok());
  EXPECT_EQ(again->values(), std::vector<float>{12});
  EXPECT_FALSE(pending->answered());
}

TEST(AllReduceHubTest, AGroupTooLargeIsRefusedBeforeAnythingIsAllocated) {
  AllReduceHub hub(absl::Seconds(30));
  const std::string one = Bytes({1});
  auto call = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(0, one, {1}, /*group=*/2147483647), call);
  absl::Status s = call->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[1, 4096]"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace summa::server
