// Elastic jobs in the core (summa-server --workers=MIN:MAX): a worker that joins a running job is
// admitted from the first step no worker can have started under the old group, the steps before
// it complete without it, the steps from it wait for it, the job's data position (the group of
// each stretch of steps) is in status and in checkpoints, and async and ssp joiners start where
// the slowest member is. Backup workers (--backup_workers=B): a step completes with the first
// group size - B pushes, a later push of it is answered at once with the newest weights, not
// summed, and counted late; with B = 0 the step waits for every rank.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status_reason.h"
#include "gtest/gtest.h"
#include "server/core/parameter_server.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

// One tensor of 4 floats in two partitions of 2, lr 1, --workers=2:3.
class ElasticTest : public ::testing::Test {
 protected:
  ServerOptions Options(Mode mode = Mode::kSync) {
    ServerOptions o;
    o.world_size = 3;
    o.min_workers = 2;
    o.mode = mode;
    o.partition_bytes = 8;
    o.optimizer.learning_rate = 1.0;
    o.lease = absl::Seconds(1);
    o.clock = &clock_;
    o.require_sessions = false;
    o.deterministic = mode == Mode::kSync;
    return o;
  }
  absl::StatusOr<JoinResult> Join(ParameterServer& ps, int rank, int world_size = 2) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = world_size;
    v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
    return ps.Join(v);
  }
  PushRequestView Push(int rank, uint64_t step, uint32_t partition, int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.partition = partition;
    v.data = ones_;
    v.num_examples = examples;
    return v;
  }
  // Every rank of `ranks` pushes both partitions of `step` (one example each).
  void Step(ParameterServer& ps, uint64_t step, const std::vector<int>& ranks) {
    for (int r : ranks) {
      for (uint32_t p : {0u, 1u}) ASSERT_TRUE(ps.Push(Push(r, step, p, 1)).ok()) << r << " " << p;
    }
  }
  static std::vector<std::pair<uint64_t, std::vector<int>>> Log(const ParameterServer& ps) {
    std::vector<std::pair<uint64_t, std::vector<int>>> out;
    for (const GroupChange& c : ps.GroupLog()) out.push_back({c.from_step, c.group.ranks});
    return out;
  }
  const std::string zeros_ = Bytes({0, 0, 0, 0});
  const std::string ones_ = Bytes({1, 1});
  FakeClock clock_;
};

TEST_F(ElasticTest, AJoinerTakesPartFromTheNextStepBoundary) {
  ParameterServer ps(Options());
  ASSERT_TRUE(Join(ps, 0).ok());
  ASSERT_TRUE(Join(ps, 1).ok());
  EXPECT_EQ(ps.LiveRanks(), (std::vector<int>{0, 1}));  // rank 2 is no member until it joins
  Step(ps, 0, {0, 1});  // only the initial group: step 0 completes
  ASSERT_EQ(ps.version(), 1u);
  ASSERT_TRUE(ps.Push(Push(0, 1, 0, 1)).ok());  // step 1 under way
  // Rank -1 is assigned the lowest free rank, and is in from step 2: step 1 may already be
  // computed over {0, 1}.
  auto joined = Join(ps, -1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank, 2);
  EXPECT_EQ(joined->next_step, 2u);
  EXPECT_EQ(joined->version, 2u);  // it pulls step 2's weights, waiting for them
  EXPECT_EQ(joined->live_ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ps.Push(Push(2, 1, 0, 1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ps.Push(Push(1, 1, 0, 1)).ok());
  ASSERT_TRUE(ps.Push(Push(0, 1, 1, 1)).ok());
  ASSERT_TRUE(ps.Push(Push(1, 1, 1, 1)).ok());
  ASSERT_EQ(ps.version(), 2u);  // without rank 2
  // Step 2 waits for rank 2; its pull of version 2 is answered, and step 3's (a push-pull) waits.
  auto pull = std::make_shared<FakeCall>();
  ps.Pull(2, joined->session, 0, 2, pull);
  ASSERT_TRUE(pull->Wait().ok());
  Step(ps, 2, {0, 1});
  EXPECT_EQ(ps.version(), 2u);
  auto reply = std::make_shared<FakeCall>();
  ps.PushPull(Push(2, 2, 0, 1), reply);
  ASSERT_TRUE(ps.Push(Push(2, 2, 1, 1)).ok());
  ASSERT_TRUE(reply->Wait().ok());
  EXPECT_EQ(ps.version(), 3u);
  // Each step divided by its own group's examples: -1 per step, three steps.
  EXPECT_EQ(reply->values(), (std::vector<float>{-3, -3}));
  EXPECT_EQ(ps.Status().examples_applied, 2u + 2u + 3u);
  EXPECT_EQ(Log(ps), (std::vector<std::pair<uint64_t, std::vector<int>>>{{0, {0, 1}}, {2, {0, 1, 2}}}));
  const StatusSnapshot s = ps.Status();
  ASSERT_EQ(s.members.size(), 3u);
  EXPECT_EQ(s.members[2].from_step, 2u);
  EXPECT_EQ(s.members[0].from_step, 0u);
}

// Partitions one step apart (the newest finished step 0, the other has not): workers may already
// compute step 1 over the old group, so the joiner is in from step 2, and may pull version 2 of
// a partition still at version 0.
TEST_F(ElasticTest, AJoinerWaitsForTheStepAfterTheNewestAnyPartitionReached) {
  ParameterServer ps(Options());
  ASSERT_TRUE(Join(ps, 0).ok());
  ASSERT_TRUE(Join(ps, 1).ok());
  ASSERT_TRUE(ps.Push(Push(0, 0, 0, 1)).ok());
  ASSERT_TRUE(ps.Push(Push(1, 0, 0, 1)).ok());  // partition 0 at version 1; partition 1 at 0
  auto joined = Join(ps, 2, 3);  // a world size from MIN to MAX is taken
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->next_step, 2u);
  auto early = std::make_shared<FakeCall>();
  ps.Pull(2, joined->session, 1, 2, early);
  EXPECT_FALSE(early->answered());
  ASSERT_TRUE(ps.Push(Push(0, 0, 1, 1)).ok());
  ASSERT_TRUE(ps.Push(Push(1, 0, 1, 1)).ok());
  Step(ps, 1, {0, 1});
  ASSERT_TRUE(early->Wait().ok());
  EXPECT_EQ(early->counter(), 2u);
  auto too_far = std::make_shared<FakeCall>();
  ps.Pull(2, joined->session, 1, 5, too_far);
  EXPECT_EQ(too_far->Wait().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ElasticTest, TheGroupIsBoundedByMaxAndARankThatLeftJoinsAgainAsGrowth) {
  ParameterServer ps(Options());
  ASSERT_TRUE(Join(ps, 0).ok());
  ASSERT_TRUE(Join(ps, 1).ok());
  ASSERT_TRUE(Join(ps, 2).ok());
  EXPECT_EQ(Join(ps, -1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Join(ps, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Join(ps, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);  // above MAX
  EXPECT_EQ(Join(ps, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);  // below MIN
  Step(ps, 0, {0, 1});  // rank 2 is in from step 1
  ASSERT_EQ(ps.version(), 1u);
  ASSERT_TRUE(ps.Leave(1, 0).ok());
  Step(ps, 1, {0, 2});
  ASSERT_EQ(ps.version(), 2u);
  // Its slot is free again: -1 takes it, from the next step.
  auto back = Join(ps, -1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 1);
  EXPECT_EQ(back->next_step, 3u);
  // Rank 1 left before anyone pushed step 1: that step's group never held it.
  EXPECT_EQ(Log(ps), (std::vector<std::pair<uint64_t, std::vector<int>>>{{0, {0, 1}}, {1, {0, 2}}, {3, {0, 1, 2}}}));
}

// A fixed job (--workers=N) cannot grow: a rank that left stays out, as before.
TEST_F(ElasticTest, AFixedJobKeepsADepartedRankOut) {
  ServerOptions o = Options();
  o.min_workers = 0;
  o.world_size = 2;
  ParameterServer ps(o);
  ASSERT_TRUE(Join(ps, 0).ok());
  ASSERT_TRUE(Join(ps, 1).ok());
  ASSERT_TRUE(ps.Leave(1, 0).ok());
  EXPECT_EQ(Join(ps, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Join(ps, -1).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ElasticTest, AnAsyncOrSspJoinerStartsWhereTheSlowestMemberIs) {
  for (Mode mode : {Mode::kAsync, Mode::kSsp}) {
    ParameterServer ps(Options(mode));
    ASSERT_TRUE(Join(ps, 0).ok());
    ASSERT_TRUE(Join(ps, 1).ok());
    for (uint64_t step = 0; step < 3; ++step) ASSERT_TRUE(ps.Push(Push(0, step, 0, 1)).ok());
    ASSERT_TRUE(ps.Push(Push(1, 0, 0, 1)).ok());  // on partition 0: rank 0 at step 3, rank 1 at 1
    auto joined = Join(ps, -1);
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->rank, 2);
    // Partition 1 has no pushes yet: the slowest there is at step 0.
    EXPECT_EQ(joined->next_step, 0u) << ModeName(mode);
    EXPECT_EQ(joined->live_ranks, (std::vector<int>{0, 1, 2}));
    // On partition 0 it pushes from step 1 (rank 1's) on: step 0 there would be a duplicate.
    EXPECT_EQ(ps.Push(Push(2, 0, 0, 1)).status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_TRUE(ps.Push(Push(2, 1, 0, 1)).ok());
  }
}

// The data position survives a restart: a checkpoint keeps the group log, the grown ranks and
// the examples summed, and the restored server waits for the grown rank as for the others.
TEST_F(ElasticTest, ACheckpointKeepsTheGroupLogAndTheGrownRanks) {
  const std::string dir = ::testing::TempDir() + "/elastic-ckpt-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ServerOptions o = Options();
  o.checkpoint_dir = dir;
  {
    ParameterServer ps(o);
    ASSERT_TRUE(Join(ps, 0).ok());
    ASSERT_TRUE(Join(ps, 1).ok());
    ASSERT_TRUE(Join(ps, 2).ok());  // from step 1
    Step(ps, 0, {0, 1});
    Step(ps, 1, {0, 1, 2});
    ASSERT_TRUE(ps.MaybeCheckpoint(true).ok());
  }
  ParameterServer restored(o);
  ASSERT_TRUE(RestoreNewest(restored, dir).ok());
  EXPECT_EQ(Log(restored), (std::vector<std::pair<uint64_t, std::vector<int>>>{{0, {0, 1}}, {1, {0, 1, 2}}}));
  EXPECT_EQ(restored.Status().examples_applied, 5u);
  for (int r : {0, 1, 2}) ASSERT_TRUE(Join(restored, r).ok());
  Step(restored, 2, {0, 1});
  EXPECT_EQ(restored.version(), 2u);  // waits for rank 2
  Step(restored, 2, {2});
  EXPECT_EQ(restored.version(), 3u);
  std::filesystem::remove_all(dir);
}

// A member that pushed and then left (or was lost) while another had not pushed: the one left
// to push computes its share over the new group, so the step starts again, the lost member's
// push dropped with the rest, or its examples would be summed twice.
TEST_F(ElasticTest, AStepThatLosesAMemberThatHadPushedStartsAgainWithoutItsPush) {
  ServerOptions o = Options();
  o.on_worker_loss = OnWorkerLoss::kShrink;
  ParameterServer ps(o);
  for (int r : {0, 1, 2}) ASSERT_TRUE(Join(ps, r).ok());  // rank 2 from step 1
  Step(ps, 0, {0, 1});
  auto waiting = std::make_shared<FakeCall>();
  ps.PushPull(Push(0, 1, 0, 1), waiting);
  ASSERT_TRUE(ps.Push(Push(1, 1, 0, 1)).ok());
  ASSERT_TRUE(ps.Leave(1, 0).ok());  // rank 2 has not pushed step 1
  const absl::Status restarted = waiting->Wait();
  EXPECT_TRUE(IsStaleView(restarted)) << restarted;
  EXPECT_EQ(ps.Status().steps_restarted, 1u);
  // Ranks 0 and 2 push their shares over {0, 2}: the step is theirs alone.
  ASSERT_TRUE(ps.Push(Push(0, 1, 0, 1)).ok());
  ASSERT_TRUE(ps.Push(Push(2, 1, 0, 1)).ok());
  EXPECT_EQ(ps.Status().examples_applied, 2u + 2u);
}

// Every member lost: the step under way has no one. A worker that comes back takes that step
// (not the one after, which would wait for a step no one can finish).
TEST_F(ElasticTest, AJoinerOfAnEmptyGroupTakesTheStepUnderWay) {
  ServerOptions o = Options();
  o.on_worker_loss = OnWorkerLoss::kShrink;
  ParameterServer ps(o);
  ASSERT_TRUE(Join(ps, 0).ok());
  ASSERT_TRUE(Join(ps, 1).ok());
  Step(ps, 0, {0, 1});
  clock_.Advance(absl::Seconds(2));
  ps.Tick(clock_.Now());  // both leases lapse: dropped
  EXPECT_EQ(ps.LiveRanks(), std::vector<int>{});
  auto back = Join(ps, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->next_step, 1u);
  EXPECT_EQ(back->live_ranks, std::vector<int>{0});
  Step(ps, 1, {0});
  EXPECT_EQ(ps.version(), 2u);
}

// Three ranks, one partition of 2 floats, sgd at lr 1, summed in rank order.
class BackupWorkersTest : public ::testing::Test {
 protected:
  ServerOptions Options(int backup_workers) {
    ServerOptions o;
    o.world_size = 3;
    o.backup_workers = backup_workers;
    o.optimizer.learning_rate = 1.0;
    o.clock = &clock_;
    o.require_sessions = false;
    o.deterministic = true;
    return o;
  }
  void JoinAll(ParameterServer& ps) {
    for (int r = 0; r < 3; ++r) {
      JoinRequestView v;
      v.rank = r;
      v.world_size = 3;
      v.params = {{{"w", DType::kFloat32, {2}}, absl::string_view(zeros_)}};
      ASSERT_TRUE(ps.Join(v).ok()) << r;
    }
  }
  PushRequestView Push(int rank, uint64_t step, int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.partition = 0;
    v.data = grads_[rank];
    v.num_examples = examples;
    return v;
  }
  std::shared_ptr<FakeCall> PushPull(ParameterServer& ps, int rank, uint64_t step, int64_t examples) {
    auto call = std::make_shared<FakeCall>();
    ps.PushPull(Push(rank, step, examples), call);
    return call;
  }
  const std::string zeros_ = Bytes({0, 0});
  // Each rank's gradient, summed over its examples.
  const std::string grads_[3] = {Bytes({1, 2}), Bytes({3, 6}), Bytes({101, 202})};
  FakeClock clock_;
};

TEST_F(BackupWorkersTest, AStepCompletesWithTheFirstPushesAndALateOneIsAnsweredAtOnceNotSummed) {
  ParameterServer ps(Options(/*backup_workers=*/1));
  JoinAll(ps);
  auto first = PushPull(ps, 0, 0, 2);
  EXPECT_FALSE(first->answered());
  clock_.Advance(absl::Seconds(1));
  auto second = PushPull(ps, 1, 0, 2);  // 3 - 1 = 2 pushes: step 0 completes with ranks 0 and 1
  ASSERT_TRUE(first->Wait().ok());
  ASSERT_TRUE(second->Wait().ok());
  // By hand: w = 0 - lr * ({1, 2} + {3, 6}) / (2 + 2).
  const std::vector<float> after_step0 = {-1, -2};
  EXPECT_EQ(second->values(), after_step0);
  EXPECT_EQ(second->counter(), 1u);
  EXPECT_FALSE(second->late());
  clock_.Advance(absl::Seconds(4));
  // Rank 2's push of step 0 comes after it completed: answered at once, with the newest weights,
  // marked late; its gradient is not summed.
  auto late = PushPull(ps, 2, 0, 2);
  ASSERT_TRUE(late->answered());
  ASSERT_TRUE(late->Wait().ok());
  EXPECT_TRUE(late->late());
  EXPECT_EQ(late->counter(), 1u);
  EXPECT_EQ(late->values(), after_step0);
  EXPECT_EQ(Weights(ps), after_step0);
  // A retry of the late push is answered alike and counted once; a plain Push of it is refused
  // with the reason.
  auto again = PushPull(ps, 2, 0, 2);
  ASSERT_TRUE(again->Wait().ok());
  EXPECT_TRUE(again->late());
  const absl::Status refused = ps.Push(Push(2, 0, 2)).status();
  EXPECT_TRUE(IsLatePush(refused)) << refused;
  StatusSnapshot s = ps.Status();
  EXPECT_EQ(s.examples_applied, 4u);
  EXPECT_EQ(s.late_pushes, 1u);
  ASSERT_EQ(s.lateness.size(), 3u);
  EXPECT_EQ(s.lateness[2].late_pushes, 1u);
  EXPECT_EQ(s.lateness[2].steps_behind, 1u);
  EXPECT_EQ(s.lateness[2].last_delay, absl::Seconds(5));  // from step 0's first push
  EXPECT_EQ(s.lateness[1].late_pushes, 0u);
  EXPECT_EQ(s.lateness[1].last_delay, absl::Seconds(1));
  EXPECT_EQ(s.lateness[1].steps_behind, 0u);
  EXPECT_EQ(s.lateness[0].last_delay, absl::ZeroDuration());
  EXPECT_EQ(s.members[2].pushes, 0u);  // none of its pushes was taken

  // Rank 2 goes on from the step the reply named, and is summed when it is among the first.
  auto on_time = PushPull(ps, 2, 1, 2);
  auto with_it = PushPull(ps, 0, 1, 2);
  ASSERT_TRUE(on_time->Wait().ok());
  ASSERT_TRUE(with_it->Wait().ok());
  EXPECT_FALSE(on_time->late());
  // By hand: w = {-1, -2} - lr * ({101, 202} + {1, 2}) / (2 + 2).
  const std::vector<float> after_step1 = {-26.5, -53};
  EXPECT_EQ(on_time->values(), after_step1);
  auto late1 = PushPull(ps, 1, 1, 2);
  ASSERT_TRUE(late1->Wait().ok());
  EXPECT_TRUE(late1->late());
  EXPECT_EQ(late1->counter(), 2u);
  EXPECT_EQ(Weights(ps), after_step1);
  s = ps.Status();
  EXPECT_EQ(s.examples_applied, 8u);
  EXPECT_EQ(s.late_pushes, 2u);
  EXPECT_EQ(s.lateness[1].late_pushes, 1u);
  EXPECT_EQ(s.lateness[2].steps_behind, 0u);  // its last push was on time
  EXPECT_EQ(s.lateness[2].late_pushes, 1u);
}

// A late push several steps behind is answered with the newest weights, whose version is past
// the step after it: the worker goes on from there.
TEST_F(BackupWorkersTest, ALatePushSeveralStepsBehindGetsTheNewestVersion) {
  ParameterServer ps(Options(1));
  JoinAll(ps);
  for (uint64_t step = 0; step < 3; ++step) {
    auto a = PushPull(ps, 0, step, 2);
    auto b = PushPull(ps, 1, step, 2);
    ASSERT_TRUE(a->Wait().ok() && b->Wait().ok()) << step;
  }
  auto late = PushPull(ps, 2, 0, 2);
  ASSERT_TRUE(late->Wait().ok());
  EXPECT_TRUE(late->late());
  EXPECT_EQ(late->counter(), 3u);
  EXPECT_EQ(ps.Status().lateness[2].steps_behind, 3u);
}

// B = 0: nothing changes; the step waits for all three.
TEST_F(BackupWorkersTest, WithoutBackupWorkersAStepWaitsForEveryRank) {
  ParameterServer ps(Options(/*backup_workers=*/0));
  JoinAll(ps);
  auto first = PushPull(ps, 0, 0, 1);
  auto second = PushPull(ps, 1, 0, 1);
  EXPECT_FALSE(first->answered());
  EXPECT_FALSE(second->answered());
  EXPECT_EQ(ps.version(), 0u);
  auto third = PushPull(ps, 2, 0, 2);
  for (auto* call : {&first, &second, &third}) ASSERT_TRUE((*call)->Wait().ok());
  EXPECT_FALSE(third->late());
  // By hand: w = 0 - lr * ({1, 2} + {3, 6} + {101, 202}) / (1 + 1 + 2).
  EXPECT_EQ(third->values(), (std::vector<float>{-26.25, -52.5}));
  // A retry is a duplicate, as before, never late.
  const absl::Status refused = ps.Push(Push(2, 0, 2)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(IsLatePush(refused));
  const StatusSnapshot s = ps.Status();
  EXPECT_EQ(s.late_pushes, 0u);
  EXPECT_TRUE(s.lateness.empty());
}

TEST(BackupWorkersOptionsTest, SyncOnlyAndFewerThanTheGroupItStartsWith) {
  ServerOptions o;
  o.world_size = 3;
  o.backup_workers = 2;
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (int bad : {-1, 3}) {
    o.backup_workers = bad;
    EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  o.backup_workers = 1;
  o.min_workers = 1;  // --workers=1:3: a group of 1 has no backup
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.min_workers = 2;
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (Mode mode : {Mode::kAsync, Mode::kSsp}) {
    o.mode = mode;
    const absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("needs sync mode"), absl::string_view::npos) << s;
  }
}

TEST(ParseWorkersTest, TakesNOrMinColonMax) {
  EXPECT_EQ(*ParseWorkers("3"), std::make_pair(3, 3));
  EXPECT_EQ(*ParseWorkers("2:5"), std::make_pair(2, 5));
  for (const char* bad : {"", "0", "3:2", "1:2:3", "a", "2:", ":3", "-1:2"}) {
    EXPECT_EQ(ParseWorkers(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ServerOptions o;
  o.min_workers = 2;
  o.world_size = 4;
  o.shards = 2;
  o.shard = 0;
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);  // one shard only
  o.shards = 1;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

}  // namespace
}  // namespace summa::server
