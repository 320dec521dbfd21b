// The checkpoint codec (server/core/checkpoint_codec.h): a server's partitions to a checkpoint's
// messages and back, refused where the job, the shard or the model differs from the file's; and
// the fuzzer's seed checkpoints, which the reader takes.
#include "server/core/checkpoint_codec.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "server/checkpoint/checkpoint_file.h"
#include "gtest/gtest.h"
#include "tests/checkpoint_fixtures.h"

namespace summa::server {
namespace {

// Two tensors (4 + 2 floats) in partitions of 16 bytes, under Adam, 2 ranks.
ServerSnapshot Snapshot() {
  ServerSnapshot s;
  s.job = {2, Mode::kAsync, 16, "adam", "adam(lr=0.001)", {"exp_avg", "exp_avg_sq"}};
  s.specs = {{"w", DType::kFloat32, {2, 2}}, {"b", DType::kFloat32, {2}}};
  s.partitions = {{0, 7, 7, {1, 2, 3, 4}, {{.1f, .2f, .3f, .4f}, {1, 1, 1, 1}}, {4, 3}},
                  {1, 6, 5, {5, 6}, {{.5f, .6f}, {2, 2}}, {3, 3}}};
  s.created = absl::FromUnixSeconds(1700000000);
  return s;
}

TEST(CheckpointCodecTest, EveryPartitionRoundTrips) {
  const ServerSnapshot s = Snapshot();
  const summa::v1::Checkpoint c = EncodeCheckpoint(s);
  EXPECT_EQ(c.version(), 6u);  // the lowest partition version
  auto back = DecodeCheckpoint(c, s.job);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->partitions.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->partitions[i].version, s.partitions[i].version);
    EXPECT_EQ(back->partitions[i].updates, s.partitions[i].updates);
    EXPECT_EQ(back->partitions[i].weights, s.partitions[i].weights);
    EXPECT_EQ(back->partitions[i].slots, s.partitions[i].slots);
    EXPECT_EQ(back->partitions[i].next_steps, s.partitions[i].next_steps);
  }
  EXPECT_EQ(back->specs, s.specs);
  EXPECT_EQ(back->created, s.created);
}

TEST(CheckpointCodecTest, AJobThatDiffersIsRefusedNamingBothSides) {
  const summa::v1::Checkpoint c = EncodeCheckpoint(Snapshot());
  JobDescription ours = Snapshot().job;
  ours.mode = Mode::kSync;
  auto refused = DecodeCheckpoint(c, ours);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("async mode"), absl::string_view::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("sync mode"), absl::string_view::npos) << refused.status();
  ours = Snapshot().job;
  ours.optimizer_name = "sgd";
  ours.slot_names = {"momentum_buffer"};
  refused = DecodeCheckpoint(c, ours);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("optimizer adam with state [exp_avg, exp_avg_sq]"),
            absl::string_view::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("optimizer sgd with state [momentum_buffer]"),
            absl::string_view::npos) << refused.status();
  // Hyperparameters may change across a restart (a lower rate, say).
  ours = Snapshot().job;
  ours.optimizer = "adam(lr=0.0001)";
  EXPECT_TRUE(DecodeCheckpoint(c, ours).ok());
}

TEST(CheckpointCodecTest, AShardsCheckpointHoldsItsPartitionsAndOnlyThatShardRestoresIt) {
  // Partition 0 (4 floats) is shard 0's of 2, partition 1 (2 floats) shard 1's.
  ServerSnapshot s = Snapshot();
  s.job.shard = 1;
  s.job.shards = 2;
  s.partitions.erase(s.partitions.begin());
  const summa::v1::Checkpoint c = EncodeCheckpoint(s);
  auto back = DecodeCheckpoint(c, s.job);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->partitions.size(), 1u);
  EXPECT_EQ(back->partitions[0].id, 1u);
  EXPECT_EQ(back->partitions[0].weights, (std::vector<float>{5, 6}));
  JobDescription other = s.job;
  other.shard = 0;
  auto refused = DecodeCheckpoint(c, other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("shard 1 of 2; this server runs"), absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("shard 0 of 2"), absl::string_view::npos) << refused.status();
  // Neither an unsharded server nor a shard takes the other's checkpoint.
  EXPECT_EQ(DecodeCheckpoint(c, Snapshot().job).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DecodeCheckpoint(EncodeCheckpoint(Snapshot()), s.job).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A job restarted on another shard count takes a whole set of the old shards' checkpoints: each
// header decodes whatever its shard (what it holds cut over its own count), and the set must be
// every old shard's, in order, of one version and one model.
TEST(CheckpointCodecTest, ASetOfEveryShardsCheckpointsDecodesForAnyShardCount) {
  std::vector<summa::v1::Checkpoint> shards;
  for (int shard : {0, 1}) {
    ServerSnapshot s = Snapshot();
    s.job.shard = shard;
    s.job.shards = 2;
    s.partitions.erase(s.partitions.begin() + (1 - shard));  // partition 0 is shard 0's, 1 shard 1's
    s.partitions[0].version = 6;  // one version: a sync job's
    s.partitions[0].updates = 5;
    shards.push_back(EncodeCheckpoint(s));
  }
  const JobDescription ours = Snapshot().job;  // one server
  auto set_of = [&](std::vector<const summa::v1::Checkpoint*> set) { return DecodeCheckpointSet(set, ours); };
  absl::StatusOr<std::vector<CheckpointHeader>> set = set_of({&shards[0], &shards[1]});
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ((*set)[i].held.size(), 1u);
    EXPECT_EQ((*set)[i].held[0].id, i) << "shard " << i << " held partition " << i << " of 2 shards";
    EXPECT_EQ((*set)[i].version, 6u);
  }
  EXPECT_EQ(DecodeCheckpointHeader(shards[1], ours).status().code(), absl::StatusCode::kFailedPrecondition)
      << "its own shard's only, unless a set is asked for";

  auto refused = [&](std::vector<const summa::v1::Checkpoint*> set) {
    absl::Status s = set_of(std::move(set)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return std::string(s.message());
  };
  EXPECT_NE(refused({&shards[0]}).find("a job on 2 shards, and 1 came"), std::string::npos);
  EXPECT_NE(refused({&shards[1], &shards[0]}).find("checkpoint 0 of a set of 2 is shard 1 of 2's"), std::string::npos);
  summa::v1::Checkpoint later = shards[1];
  later.set_version(7);
  EXPECT_NE(refused({&shards[0], &later}).find("shard 1's checkpoint is of version 7 and shard 0's of 6"),
            std::string::npos);
  summa::v1::Checkpoint other_model = shards[1];
  other_model.mutable_params(1)->set_name("bias");
  EXPECT_NE(refused({&shards[0], &other_model}).find("another model"), std::string::npos);
  JobDescription recut = ours;
  recut.partition_bytes = 8;
  const absl::Status cut = DecodeCheckpointSet({&shards[0], &shards[1]}, recut).status();
  EXPECT_NE(cut.message().find("shard 0's checkpoint: the checkpoint is of a job of 2 workers, async mode, partitions "
                               "of 16 bytes"),
            absl::string_view::npos)
      << cut;
  EXPECT_NE(cut.message().find("--partition_bytes=16, this server's of 8"), absl::string_view::npos) << cut;
}

TEST(CheckpointCodecTest, SyncPartitionsAtDifferentVersionsAreDataLoss) {
  ServerSnapshot s = Snapshot();
  s.job.mode = Mode::kSync;
  EXPECT_EQ(DecodeCheckpoint(EncodeCheckpoint(s), s.job).status().code(), absl::StatusCode::kDataLoss);
  s.partitions[0].version = 6;
  s.partitions[0].updates = 6;
  s.partitions[0].next_steps = {6, 6};
  s.partitions[1].next_steps = {6, 7};  // a push of step 6 recorded at version 6
  EXPECT_EQ(DecodeCheckpoint(EncodeCheckpoint(s), s.job).status().code(), absl::StatusCode::kDataLoss);
  s.partitions[1].next_steps = {6, 6};
  EXPECT_TRUE(DecodeCheckpoint(EncodeCheckpoint(s), s.job).ok());
}

TEST(CheckpointCodecTest, PartitionsThatDoNotTileTheModelAreDataLoss) {
  summa::v1::Checkpoint c = EncodeCheckpoint(Snapshot());
  c.mutable_partitions(1)->mutable_slots(1)->resize(4);
  EXPECT_EQ(DecodeCheckpoint(c, Snapshot().job).status().code(), absl::StatusCode::kDataLoss);
  c = EncodeCheckpoint(Snapshot());
  c.mutable_partitions()->RemoveLast();
  EXPECT_EQ(DecodeCheckpoint(c, Snapshot().job).status().code(), absl::StatusCode::kDataLoss);
}

// A checkpoint's model is a claim until its partitions are there: one of 2^40 floats in 16-byte
// partitions (2^38 of them) with two partitions in the file is DATA_LOSS at once; the partition
// map was built first (and would not have fit in memory).
TEST(CheckpointCodecTest, AModelFarLargerThanItsPartitionsIsDataLossBeforeAnyMapIsBuilt) {
  summa::v1::Checkpoint c = EncodeCheckpoint(Snapshot());
  c.mutable_params(0)->set_shape(0, int64_t{1} << 20);
  c.mutable_params(0)->set_shape(1, int64_t{1} << 20);
  const absl::Status s = DecodeCheckpoint(c, Snapshot().job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("would be over 1048576 partitions"), absl::string_view::npos) << s;
}

// fuzz/corpus/checkpoint_fuzzer holds a checkpoint of each of the fuzzer's jobs, written by the
// real writer (summa-fuzz-seeds) after a control byte: they stay files that the reader takes.
TEST(CheckpointCodecTest, TheFuzzSeedsAreCheckpointsTheReaderTakes) {
  for (const char* job : {"job0", "job1", "job2"}) {
    std::ifstream in(std::string(SUMMA_SOURCE_DIR) + "/fuzz/corpus/checkpoint_fuzzer/" + job + "-file",
                     std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(seed.size(), 1u) << job;
    const std::string path = ::testing::TempDir() + "/fuzz-seed-" + job + ".summa";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << seed.substr(1);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_GE((*reader)->header().version(), 1u) << job;  // a step or more was taken
    EXPECT_EQ((*reader)->header().params_size(), 2) << job;
    summa::v1::PartitionCheckpoint partition;
    int partitions = 0;
    for (;;) {
      absl::StatusOr<bool> more = (*reader)->Next(&partition);
      ASSERT_TRUE(more.ok()) << job << ": " << more.status();
      if (!*more) break;
      ++partitions;
    }
    EXPECT_GE(partitions, 1) << job;
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace summa::server
