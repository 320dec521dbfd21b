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
    const float w[3] = {1, 2, float(version)};
    c.set_weights(reinterpret_cast<const char*>(w), sizeof(w));
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
  EXPECT_EQ(restored->checkpoint.weights(), Make(30).weights());
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

TEST_F(CheckpointTest, EmptyOrMissingDirectoryHasNone) {
  std::vector<std::string> warnings;
  EXPECT_FALSE(LoadNewestCheckpoint(dir_, &warnings).has_value());
}

}  // namespace
}  // namespace summa::server
