// Coordination of server shards (server/rpc/coordination.h, server/rpc/follow.cc): a follower
// reports to shard 0, a real daemon on 127.0.0.1:0, follows its membership view and decides alone
// once it is gone; shard 0 holds a report until its view moves, and only so many at once.
#include "server/rpc/coordination.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/service_fixtures.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {
namespace {

// Shard 0's options in a job of two shards under shrink (no sessions asked: the tests admit
// ranks themselves), and shard 1's, a follower's.
ServerOptions ShardZeroOptions(int world_size) {
  ServerOptions o;
  o.world_size = world_size;
  o.shards = 2;
  o.on_worker_loss = OnWorkerLoss::kShrink;
  o.require_sessions = false;
  return o;
}
ServerOptions ShardOneOptions(int world_size) {
  ServerOptions o = ShardZeroOptions(world_size);
  o.shard = 1;
  o.follower = true;
  return o;
}

// Admits `rank` to shard 0 and has it leave: the view moves on.
void LeaveOnShardZero(Membership& members, int rank) {
  absl::StatusOr<Admitted> admitted = members.Admit(rank, "", "");
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_TRUE(members.Leave(rank, admitted->session).ok());
}

// Shard 1 reports to shard 0 (a real daemon), follows its view, shows in its status, and once
// shard 0 is gone for its give-up time decides by its own leases again.
TEST(ShardFollowerTest, ReportsToShardZeroFollowsItsViewAndDecidesAloneOnceItIsGone) {
  auto zero = SummaServer::Start("127.0.0.1:0", ShardZeroOptions(2));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ParameterServer one(ShardOneOptions(2));
  const std::string address = "127.0.0.1:" + std::to_string((*zero)->port());
  ShardFollower follower(address, {}, &one, absl::Milliseconds(20), /*give_up=*/absl::Milliseconds(300));

  auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  pb::ServerStatus status;
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext ctx;
    status.Clear();
    return stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok() && status.shard_statuses_size() == 2;
  })) << status.DebugString();
  EXPECT_EQ(status.shard_statuses(0).shard(), 0);
  EXPECT_EQ(status.shard_statuses(1).shard(), 1);
  EXPECT_TRUE(status.shard_statuses(1).healthy());

  // Rank 1 leaves on shard 0: the view moves on, and shard 1 drops it too.
  LeaveOnShardZero((*zero)->core().membership(), 1);
  EXPECT_TRUE(Eventually([&] { return one.membership().view() == 1; }));
  EXPECT_EQ(one.LiveRanks(), std::vector<int>{0});
  EXPECT_TRUE(one.membership().follower());

  // Shard 0 goes: after the give-up time shard 1 decides alone.
  (*zero)->Shutdown();
  EXPECT_TRUE(Eventually([&] { return !one.membership().follower(); }));
}

// Shard 0 holds a follower's report while the view stands and answers it as soon as the view
// moves: a follower that reports only hourly still hears of an exclusion at once.
TEST(ShardFollowerTest, HearsOfAnExclusionWhenItHappensNotAtItsNextReport) {
  auto zero = SummaServer::Start("127.0.0.1:0", ShardZeroOptions(3));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ParameterServer one(ShardOneOptions(3));
  const std::string address = "127.0.0.1:" + std::to_string((*zero)->port());
  ShardFollower follower(address, {}, &one, /*interval=*/absl::Hours(1));

  // Its first report (no shard 0 process followed yet) is answered at once; the next one, of
  // shard 0's process and view, is held.
  Membership& members = (*zero)->core().membership();
  ASSERT_TRUE(Eventually([&] { return one.membership().followed_incarnation() == members.incarnation(); }));

  // Each rank that leaves reaches shard 1 within Eventually's 20 s: well before its next report
  // (an hour) and shard 0's longest hold (30 s). The second needs the report sent again at once
  // after the first's answer.
  for (int rank : {1, 2}) {
    LeaveOnShardZero(members, rank);
    EXPECT_TRUE(Eventually([&] { return one.membership().view() == static_cast<uint64_t>(rank); })) << rank;
  }
  EXPECT_EQ(one.LiveRanks(), std::vector<int>{0});
}

// What shard 0 holds: a report of its own process and view, until the view moves or the report's
// wait passes (then answered with held set); any other report is answered at once, not held.
TEST(ShardFollowerTest, ShardZeroHoldsOnlyAReportOfItsOwnProcessAndView) {
  auto zero = SummaServer::Start("127.0.0.1:0", ShardZeroOptions(2));
  ASSERT_TRUE(zero.ok()) << zero.status();
  const Membership& members = (*zero)->core().membership();
  auto stub = pb::ParameterServer::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*zero)->port()), grpc::InsecureChannelCredentials()));
  auto follow = [&](uint32_t wait_ms, uint64_t incarnation, absl::Duration deadline, pb::ShardView* view) {
    pb::ShardReport report;
    report.set_shard(1);
    report.set_shards(2);
    report.set_view(members.view());
    report.set_incarnation(incarnation);
    report.set_wait_ms(wait_ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return stub->Follow(&ctx, report, view);
  };
  pb::ShardView view;
  // Held (an hour asked, 30 s at most): answered neither within 2 s ...
  EXPECT_EQ(follow(3600 * 1000, members.incarnation(), absl::Seconds(2), &view).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // ... nor when the view number is the same but of another shard 0 process: at once, not held.
  ASSERT_TRUE(follow(3600 * 1000, members.incarnation() + 1, absl::Seconds(10), &view).ok());
  EXPECT_FALSE(view.held());
  EXPECT_EQ(view.incarnation(), members.incarnation());
  // A follower from before wait_ms: at once.
  ASSERT_TRUE(follow(0, members.incarnation(), absl::Seconds(10), &view).ok());
  EXPECT_FALSE(view.held());
  // A short wait passes: answered, held.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(follow(100, members.incarnation(), absl::Seconds(10), &view).ok());
  EXPECT_TRUE(view.held());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(view.view(), members.view());

  // Reports answered at the end of their wait let go of their parked-call holds (a follower
  // reports twice a second for as long as the view stands): the server's count comes down (each
  // is let go as it is answered; without that it would stay at 20 and more).
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(follow(10, members.incarnation(), absl::Seconds(10), &view).ok());
  pb::ServerStatus status;
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext ctx;
    status.Clear();
    return stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok() && status.parked_calls() <= 1;
  })) << status.parked_calls();
}

// Each held report waits on a thread of the server's: shard 0 holds at most kMaxHeldReports at
// once and answers the next at once, not held.
TEST(ShardFollowerTest, ShardZeroHoldsABoundedNumberOfReportsAtOnce) {
  auto zero = SummaServer::Start("127.0.0.1:0", ShardZeroOptions(2));
  ASSERT_TRUE(zero.ok()) << zero.status();
  const Membership& members = (*zero)->core().membership();
  auto stub = pb::ParameterServer::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*zero)->port()), grpc::InsecureChannelCredentials()));
  pb::ShardReport report;
  report.set_shard(1);
  report.set_shards(2);
  report.set_view(members.view());
  report.set_incarnation(members.incarnation());
  report.set_wait_ms(3600 * 1000);
  constexpr int kHeld = ParameterServerService::kMaxHeldReports;
  grpc::CompletionQueue queue;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ShardView>>> calls;
  std::vector<pb::ShardView> views(kHeld);
  std::vector<grpc::Status> statuses(kHeld);
  for (int i = 0; i < kHeld; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    calls.push_back(stub->AsyncFollow(contexts.back().get(), report, &queue));
    calls.back()->Finish(&views[i], &statuses[i], reinterpret_cast<void*>(static_cast<intptr_t>(i)));
  }
  pb::ServerStatus status;
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext ctx;
    status.Clear();
    return stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok() && status.parked_calls() == kHeld;
  })) << status.parked_calls();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  pb::ShardView view;
  EXPECT_TRUE(stub->Follow(&ctx, report, &view).ok());  // not held: at once
  EXPECT_FALSE(view.held());
  for (auto& c : contexts) c->TryCancel();
  for (int i = 0; i < kHeld; ++i) {
    void* tag;
    bool ok;
    ASSERT_TRUE(queue.Next(&tag, &ok));
  }
}

}  // namespace
}  // namespace summa::server
