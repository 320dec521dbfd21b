// The core's checkpoints (server/core/parameter_server_checkpoint.cc): what a checkpoint keeps
// (weights, versions, optimizer state, the group, the pushes each partition has seen) and what a
// restored server does with it.
#include "server/core/parameter_server.h"

#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

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

// Every rank leaves at a job's end; a checkpoint written then (the daemon's last, at SIGTERM) still
// lets a restarted server's members join again: only dropped ranks stay out.
TEST_F(MembershipTest, ACheckpointOfAJobWhoseRanksAllLeftRestoresIntoOneTheyCanJoin) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-ps-left-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.require_sessions = false;
  o.checkpoint_dir = dir;
  auto ps = Make(o);
  ASSERT_TRUE(ps->Push(Push(0, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->Push(Push(1, 0, twos_, 2)).ok());
  ASSERT_TRUE(ps->Leave(0, 0).ok());
  ASSERT_TRUE(ps->Leave(1, 0).ok());
  ASSERT_TRUE(ps->LiveRanks().empty());
  ASSERT_TRUE(ps->MaybeCheckpoint(true).ok());
  ServerOptions o2 = o;
  o2.world_size = 2;
  o2.optimizer.learning_rate = 1.0;
  o2.clock = &clock_;
  ParameterServer again(o2);
  ASSERT_TRUE(RestoreNewest(again, dir).ok());
  EXPECT_EQ(again.LiveRanks(), (std::vector<int>{0, 1}));
  ASSERT_TRUE(again.Join(Rejoin(0)).ok());
  ASSERT_TRUE(again.Join(Rejoin(1)).ok());
  EXPECT_EQ(again.Status().version, 1u);
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
  whole.clear_group_changes();
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

// A sync job under Adam (two state slots, and the update count its bias correction reads) on
// server shards: two ranks, 23 floats (w 4x5, b 3) in six partitions of at most 4 floats, which
// 1, 2, 3 and 4 shards deal out differently (each of 3 shards takes partitions of both of 2).
class ReshardTest : public ::testing::Test {
 protected:
  struct Shard {
    std::unique_ptr<ParameterServer> server;
    std::vector<PartitionRange> held;  // as its joins listed them
  };
  using Job = std::vector<Shard>;

  ReshardTest() {
    root_ = std::filesystem::temp_directory_path() / ("summa-reshard-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
  }
  ~ReshardTest() override { std::filesystem::remove_all(root_); }

  ServerOptions Options(int shard, int shards, const std::string& dir) {
    ServerOptions o;
    o.require_sessions = false;
    o.world_size = 2;
    o.optimizer.name = "adam";
    o.optimizer.learning_rate = 0.01;
    o.partition_bytes = 16;
    o.shard = shard;
    o.shards = shards;
    o.checkpoint_dir = dir;
    o.checkpoint_every = 0;
    o.clock = &clock_;
    return o;
  }

  // `shards` shards with `dir` as the job's checkpoint directory, none joined yet.
  Job Make(int shards, const std::string& dir) {
    Job job;
    for (int i = 0; i < shards; ++i) job.push_back({std::make_unique<ParameterServer>(Options(i, shards, dir)), {}});
    return job;
  }

  // Both ranks join every shard, rank 0 with the initial values when `with_values`.
  void JoinAll(Job& job, bool with_values) {
    std::vector<float> w(20), b = {0.5f, -0.25f, 0.125f};
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i) - 0.4f;
    const std::string w_bytes = Bytes(w), b_bytes = Bytes(b);
    for (Shard& shard : job) {
      for (int rank : {0, 1}) {
        const bool values = with_values && rank == 0;
        JoinRequestView v;
        v.rank = rank;
        v.world_size = 2;
        v.params = {{{"w", DType::kFloat32, {4, 5}}, values ? absl::string_view(w_bytes) : absl::string_view()},
                    {{"b", DType::kFloat32, {3}}, values ? absl::string_view(b_bytes) : absl::string_view()}};
        absl::StatusOr<JoinResult> joined = shard.server->Join(v);
        ASSERT_TRUE(joined.ok()) << joined.status();
        shard.held = joined->partitions;
      }
    }
  }

  // Step `step` of both ranks on every partition of `job`'s shards (or of shard `only` alone).
  // Each gradient depends on the step, the rank and the element's place in the model alone, so
  // any shard count computes the same.
  void Step(Job& job, uint64_t step, int only = -1) {
    for (size_t i = 0; i < job.size(); ++i) {
      if (only >= 0 && static_cast<int>(i) != only) continue;
      PushBothRanks(*job[i].server, job[i].held, step);
    }
  }

  static std::vector<float> Weights(const Job& job) {
    std::vector<const ParameterServer*> shards;
    for (const Shard& shard : job) shards.push_back(shard.server.get());
    return ParameterServerPeer::JobWeights(shards);
  }

  // What the daemon restores at start into `ps` (server/daemon.cc).
  static absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreAtStart(ParameterServer& ps,
                                                                         std::vector<std::string>* warnings) {
    const ServerOptions& o = ps.options();
    return RestoreNewestForShard(
        o.checkpoint_dir, o.shard, o.shards, [&](CheckpointReader& r) { return ps.Restore(r.header(), r); },
        [&](absl::Span<CheckpointReader* const> readers) {
          std::vector<ParameterServer::ShardCheckpoint> set;
          for (CheckpointReader* r : readers) set.push_back({&r->header(), r});
          return ps.RestoreResharded(set);
        },
        warnings);
  }

  std::string root_;
  FakeClock clock_;
};

// A 2-shard job checkpoints after 3 steps (shard 0 alone one step further, a version shard 1 does
// not keep). Restarted on 1, 3 and 4 shards, each shard takes its partitions from the old shards'
// checkpoints of version 3, optimizer state included; 3 more steps end with the weights of the
// job that never stopped, bit for bit.
TEST_F(ReshardTest, ACheckpointOfTwoShardsRestoresIntoOneThreeOrFourAndTheJobGoesOnBitForBit) {
  constexpr uint64_t kBefore = 3, kAfter = 3;
  Job undisturbed = Make(2, "");
  JoinAll(undisturbed, true);
  for (uint64_t s = 0; s < kBefore + kAfter; ++s) Step(undisturbed, s);
  const std::vector<float> expected = Weights(undisturbed);
  ASSERT_EQ(expected.size(), 23u);

  const std::string dir = root_ + "/job";
  {
    Job first = Make(2, dir);
    JoinAll(first, true);
    ASSERT_EQ(first[0].held.size(), 3u);
    for (uint64_t s = 0; s < kBefore; ++s) Step(first, s);
    for (Shard& shard : first) ASSERT_TRUE(shard.server->MaybeCheckpoint(true).ok());
    Step(first, kBefore, /*only=*/0);
    ASSERT_TRUE(first[0].server->MaybeCheckpoint(true).ok());
  }
  ASSERT_EQ(CheckpointVersions(ShardCheckpointDir(dir, 0, 2)), (std::vector<uint64_t>{kBefore, kBefore + 1}));
  ASSERT_EQ(CheckpointVersions(ShardCheckpointDir(dir, 1, 2)), (std::vector<uint64_t>{kBefore}));

  for (int shards : {1, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("restored on ", shards, " shards"));
    Job again = Make(shards, dir);
    int partitions = 0;
    for (Shard& shard : again) {
      std::vector<std::string> warnings;
      absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreAtStart(*shard.server, &warnings);
      ASSERT_TRUE(restored.ok()) << restored.status();
      ASSERT_TRUE(restored->has_value());
      EXPECT_EQ((*restored)->from_shards, 2);
      EXPECT_EQ((*restored)->path, CheckpointPath(ShardCheckpointDir(dir, 0, 2), kBefore));
      EXPECT_TRUE(warnings.empty()) << warnings[0];
      const StatusSnapshot status = shard.server->Status();
      EXPECT_EQ(status.version, kBefore);
      EXPECT_EQ(status.checkpoint.version, kBefore);
      partitions += status.partition_count;
    }
    EXPECT_EQ(partitions, 6);
    JoinAll(again, false);
    for (uint64_t s = kBefore; s < kBefore + kAfter; ++s) Step(again, s);
    EXPECT_EQ(Weights(again), expected);
  }
}

// A set that is not whole, or partitions of another size, are refused by name, and nothing is
// restored.
TEST_F(ReshardTest, AnIncompleteSetOrPartitionsOfAnotherSizeAreRefusedByName) {
  const std::string dir = root_ + "/job";
  {
    Job first = Make(2, dir);
    JoinAll(first, true);
    for (uint64_t s = 0; s < 2; ++s) Step(first, s);
    for (Shard& shard : first) ASSERT_TRUE(shard.server->MaybeCheckpoint(true).ok());
  }
  std::vector<std::string> warnings;
  ServerOptions o = Options(0, 4, dir);
  o.partition_bytes = 32;
  ParameterServer recut(o);
  absl::StatusOr<std::optional<RestoredCheckpoint>> refused = RestoreAtStart(recut, &warnings);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("--partition_bytes=16, this server's of 32"), absl::string_view::npos)
      << refused.status();
  EXPECT_FALSE(recut.Status().model_defined);

  std::filesystem::remove_all(ShardCheckpointDir(dir, 1, 2));  // shard 1's files lost
  ParameterServer lost(Options(0, 4, dir));
  refused = RestoreAtStart(lost, &warnings);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(
                absl::StrCat("shard 0 keeps 2; shard 1 none (", ShardCheckpointDir(dir, 1, 2), " is missing or empty)")),
            absl::string_view::npos)
      << refused.status();
  EXPECT_FALSE(lost.Status().model_defined);
  EXPECT_TRUE(warnings.empty());
}

}  // namespace
}  // namespace summa::server
