// The core's members (server/core/membership.h as ParameterServer runs it): sessions and fencing,
// leases, shrink and wait on a lost worker, the membership view, and a shard that follows shard
// 0's view.
#include "server/core/parameter_server.h"

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status_reason.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

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

// A member lost before it pushed a step leaves that step without its shard of the batch: the
// step starts again under the group left (its sum dropped, the push-pulls told to compute their
// shard again), so that every example of the batch is summed once.
TEST_F(MembershipTest, ShrinkDropsALapsedMemberAndStartsItsStepAgainWithoutIt) {
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
  const absl::Status restarted = pull->Wait();
  EXPECT_TRUE(IsStaleView(restarted)) << restarted;
  EXPECT_NE(restarted.message().find("step 0 of partition 0 starts again under view 1 (ranks 0)"),
            absl::string_view::npos) << restarted;
  EXPECT_EQ(ps->Status().version, 0u);
  EXPECT_EQ(ps->Status().steps_restarted, 1u);
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, 0));  // nothing applied
  // Rank 0 computes the whole batch now (4 examples) and pushes the step again, stamped with
  // the new view: it completes alone, divided by its 4 examples: w = 0 - 4/4.
  const std::string fours = Floats4(4);
  PushRequestView again = Push(0, 0, fours, 4);
  again.view = 1;
  auto second = std::make_shared<FakeCall>();
  ps->PushPull(again, second);
  ASSERT_TRUE(second->Wait().ok());
  EXPECT_EQ(Weights(*ps), std::vector<float>(4, -1));
  EXPECT_EQ(ps->Status().examples_applied, 4u);
  EXPECT_EQ(ps->LiveRanks(), std::vector<int>{0});
  auto refused = ps->Push(Push(1, 1, twos_, 2));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dropped"), absl::string_view::npos) << refused.status();
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
  ASSERT_TRUE(ps->Leave(1, 0).ok());  // step 0 starts again without rank 1
  ASSERT_EQ(ps->view(), 1u);
  ASSERT_EQ(ps->Status().version, 0u);
  // Rank 0's push of step 0 was dropped with the step: pushed again (stamped with the new view),
  // it completes the step alone.
  PushRequestView redo = Push(0, 0, twos_, 2);
  redo.view = 1;
  ASSERT_TRUE(ps->Push(redo).ok());
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

// On a follower a rank's Leave excludes it without moving the view's number (that is shard 0's to
// move): the step that waited for it starts again without it all the same, and shard 0's view,
// arriving after, finds nothing left to do. A step's group follows exclusions, not the number.
TEST_F(MembershipTest, ALeaveThatReachesAFollowerFirstStartsTheStepItWaitedForAgain) {
  ServerOptions o;
  o.require_sessions = false;
  o.follower = true;
  auto follower = Make(o);
  auto first = std::make_shared<FakeCall>();
  follower->PushPull(Push(0, 0, twos_, 2), first);
  EXPECT_FALSE(first->answered());
  ASSERT_TRUE(follower->Leave(1, 0).ok());
  EXPECT_EQ(follower->Status().view, 0u);  // the number is shard 0's
  EXPECT_TRUE(IsStaleView(first->Wait()));
  auto pull = std::make_shared<FakeCall>();
  follower->PushPull(Push(0, 0, twos_, 2), pull);
  ASSERT_TRUE(pull->Wait().ok());
  EXPECT_EQ(pull->counter(), 1u);
  EXPECT_EQ(Weights(*follower), std::vector<float>(4, -1));
  follower->membership().Follow(99, 1, {1}, "");
  EXPECT_EQ(follower->Status().view, 1u);
  // The next step runs under the group without rank 1.
  auto next = std::make_shared<FakeCall>();
  follower->PushPull(Push(0, 1, twos_, 2), next);
  ASSERT_TRUE(next->Wait().ok());
  EXPECT_EQ(Weights(*follower), std::vector<float>(4, -2));
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
  // Shard 0's view reaches it: rank 1 is dropped there too and the step starts again without
  // it; rank 0's push, sent again with shard 0's view, completes it.
  Membership& m = follower->membership();
  const uint64_t incarnation = zero->membership().incarnation();
  m.Follow(incarnation, zero->membership().view(), zero->membership().ExcludedRanks(), zero->job_error());
  EXPECT_TRUE(IsStaleView(pull->Wait()));
  pull = std::make_shared<FakeCall>();
  PushRequestView again = Push(0, 0, twos_, 2);
  again.view = 1;
  follower->PushPull(again, pull);
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

}  // namespace
}  // namespace summa::server
