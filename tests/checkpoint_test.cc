#include "server/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("summa-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static summa::v1::Checkpoint Make(uint64_t version) {
    summa::v1::Checkpoint c;
    c.set_version(version);
    c.set_world_size(2);
    c.set_optimizer("sgd(lr=" + std::to_string(version) + ")");
    return c;
  }

  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, RoundTripsAndKeepsTheNewestTwo) {
  for (uint64_t v : {10, 20, 30}) ASSERT_TRUE(WriteCheckpoint(dir_, Make(v)).ok());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.path().extension() == ".summa";
  EXPECT_EQ(files, 2);
  std::vector<std::string> warnings;
  auto restored = LoadNewestCheckpoint(dir_, &warnings);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->checkpoint.version(), 30u);
  EXPECT_EQ(restored->checkpoint.optimizer(), Make(30).optimizer());
  EXPECT_TRUE(warnings.empty());
}

TEST_F(CheckpointTest, TornAndCorruptFilesAreIgnoredWithAWarning) {
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(10)).ok());
  auto newest = WriteCheckpoint(dir_, Make(20));
  ASSERT_TRUE(newest.ok());
  // A crash mid-write of a later checkpoint: a truncated file with a newer name.
  const std::string torn = (dir_ / "ckpt-000000000030.summa").string();
  {
    std::ifstream in(*newest, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(torn, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  EXPECT_EQ(ReadCheckpoint(torn).status().code(), absl::StatusCode::kDataLoss);
  // A flipped byte in the newest whole file fails its checksum.
  {
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  EXPECT_NE(ReadCheckpoint(*newest).status().message().find("checksum"), absl::string_view::npos);
  std::vector<std::string> warnings;
  auto restored = LoadNewestCheckpoint(dir_, &warnings);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->checkpoint.version(), 10u);
  EXPECT_EQ(warnings.size(), 2u);
}

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
  EXPECT_NE(s.message().find("holds 2 partitions; its model has 274877906945"), absl::string_view::npos) << s;
}

TEST_F(CheckpointTest, EmptyOrMissingDirectoryHasNone) {
  std::vector<std::string> warnings;
  EXPECT_FALSE(LoadNewestCheckpoint(dir_, &warnings).has_value());
}

}  // namespace
}  // namespace summa::server
