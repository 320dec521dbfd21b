// A shard's rollback to an older checkpoint (ParameterServer::RollBack,
// server/core/parameter_server_checkpoint.cc), and the sync checkpoints it rolls back to: one at
// each multiple of the interval, of the weights as that version was reached.
#include "server/core/parameter_server.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

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
    shard_dir_ = ShardCheckpointDir(dir_, 0, 2);
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
  std::string dir_;        // the job's
  std::string shard_dir_;  // shard 0's, in it
  FakeClock clock_;
  int due_ = 0;
};

TEST_F(RollBackTest, SyncCheckpointsAreOfMultiplesOfTheIntervalAsTheyWereReached) {
  auto ps = Make(/*every=*/2);
  ASSERT_TRUE(Step(*ps, 0).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_TRUE(CheckpointVersions(shard_dir_).empty()) << "version 1 is not a multiple of 2";
  ASSERT_TRUE(Step(*ps, 1).ok());
  EXPECT_EQ(due_, 1) << "told once, when both partitions held version 2";
  ASSERT_TRUE(Step(*ps, 2).ok());  // live at version 3 before the writer runs
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{2}));
  ParameterServer again(ps->options());
  std::vector<std::string> warnings;
  absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestCheckpoint(
      shard_dir_, [&](CheckpointReader& r) { return again.Restore(r.header(), r); }, &warnings);
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ(again.Status().version, 2u);
  EXPECT_EQ(Weights(again), At(2)) << "the weights as version 2 was reached, not the live ones";
  ASSERT_TRUE(Step(*ps, 3).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(due_, 2);
  // A forced checkpoint (SIGTERM, the Checkpoint RPC) of the live version skips no multiple.
  ASSERT_TRUE(Step(*ps, 4).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());
  ASSERT_TRUE(Step(*ps, 5).ok());
  ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{2, 4, 5, 6}));
}

TEST_F(RollBackTest, AShardRollsBackToAnOlderCheckpointAndEveryMemberJoinsAgain) {
  auto ps = Make(/*every=*/1);
  for (uint64_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(Step(*ps, step).ok());
    ASSERT_TRUE(ps->MaybeCheckpoint(false).ok());
  }
  ASSERT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{1, 2, 3, 4}));
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
  EXPECT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{1, 2})) << "the abandoned history is removed";
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
  EXPECT_EQ(CheckpointVersions(shard_dir_), (std::vector<uint64_t>{1, 2, 5}));
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
