#include "common/idx.h"

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace summa {
namespace {

std::string Header(int dims, std::initializer_list<uint32_t> sizes) {
  std::string h = {0, 0, 8, static_cast<char>(dims)};
  for (uint32_t s : sizes) {
    h += static_cast<char>(s >> 24);
    h += static_cast<char>(s >> 16);
    h += static_cast<char>(s >> 8);
    h += static_cast<char>(s);
  }
  return h;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("summa-idx-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteGz(const std::string& name, const std::string& bytes) {
    gzFile f = gzopen((dir_ / name).c_str(), "wb");
    gzwrite(f, bytes.data(), bytes.size());
    gzclose(f);
  }
  void WritePlain(const std::string& name, const std::string& bytes) {
    std::FILE* f = std::fopen((dir_ / name).c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  // Two 28x28 images (pixel values i % 256) and their labels.
  void WriteGoodSet(const std::string& split, int images = 2, int labels = 2) {
    std::string pixels(images * 784, 0);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i % 256);
    WriteGz(split + "-images-idx3-ubyte.gz", Header(3, {uint32_t(images), 28, 28}) + pixels);
    WritePlain(split + "-labels-idx1-ubyte", Header(1, {uint32_t(labels)}) + std::string(labels, 7));
  }

  std::filesystem::path dir_;
};

TEST_F(IdxTest, LoadsGzippedAndPlainFilesScaledToUnitRange) {
  WriteGoodSet("train");
  auto set = LoadDataset(dir_, "train");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->count, 2);
  EXPECT_EQ(set->rows, 28);
  EXPECT_EQ(set->images[255], 1.0f);
  EXPECT_EQ(set->images[1], 1.0f / 255);
  EXPECT_EQ(set->labels, (std::vector<int32_t>{7, 7}));
}

TEST_F(IdxTest, MissingFileIsNamed) {
  auto set = LoadDataset(dir_, "t10k");
  EXPECT_EQ(set.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(set.status().message().find("t10k-images-idx3-ubyte"), absl::string_view::npos);
}

TEST_F(IdxTest, TruncatedFileSaysHowShort) {
  WriteGz("train-images-idx3-ubyte.gz", Header(3, {2, 28, 28}) + std::string(1000, 1));
  WritePlain("train-labels-idx1-ubyte", Header(1, {2}) + std::string(2, 1));
  auto set = LoadDataset(dir_, "train");
  EXPECT_EQ(set.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(set.status().message().find("train-images-idx3-ubyte.gz: truncated"), absl::string_view::npos)
      << set.status();
  EXPECT_NE(set.status().message().find("1568"), absl::string_view::npos) << set.status();
}

TEST_F(IdxTest, MismatchedCountsAreRefused) {
  WriteGoodSet("train", 2, 3);
  auto set = LoadDataset(dir_, "train");
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("2 images but"), absl::string_view::npos) << set.status();
}

TEST_F(IdxTest, WrongMagicAndDimensionsAreRefused) {
  WritePlain("x", "GIF89a....");
  auto r = ReadIdx(dir_ / "x", 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not an unsigned-byte IDX file"), absl::string_view::npos);
  WritePlain("y", Header(1, {4}) + "abcd");
  EXPECT_NE(ReadIdx(dir_ / "y", 3).status().message().find("has 1 dimensions, expected 3"),
            absl::string_view::npos);
  WritePlain("z", Header(1, {2}) + std::string(3, 1));
  EXPECT_NE(ReadIdx(dir_ / "z", 1).status().message().find("past"), absl::string_view::npos);
}

// Three dimensions of up to 2^31 each overflowed the int64 product (undefined; 2^31 x
// 2^31 x 4 wrapped to 0, and the file was taken as a whole array with no data at all).
TEST_F(IdxTest, DimensionsWhoseProductOverflowsAreRefused) {
  WritePlain("x", Header(3, {1u << 31, 1u << 31, 4}));
  auto r = ReadIdx(dir_ / "x", 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("header claims more than"), absl::string_view::npos) << r.status();
}

// A header's size is a claim: a short file whose header promises 8 GiB is refused without first
// allocating (and zero-filling) those 8 GiB.
TEST_F(IdxTest, ShortFileWithAHugeHeaderIsRefusedWithoutAllocatingItsClaim) {
  WriteGz("x.gz", Header(3, {1u << 15, 1u << 9, 1u << 9}) + std::string(10, 1));
  auto r = ReadIdx(dir_ / "x.gz", 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("promises 8589934592 data bytes, file has 10"), absl::string_view::npos)
      << r.status();
}

TEST_F(IdxTest, LabelOutsideTheClassesIsRefused) {
  WriteGz("train-images-idx3-ubyte.gz", Header(3, {1, 28, 28}) + std::string(784, 0));
  WritePlain("train-labels-idx1-ubyte", Header(1, {1}) + std::string(1, 12));
  auto set = LoadDataset(dir_, "train");
  EXPECT_NE(set.status().message().find("label 0 is 12"), absl::string_view::npos) << set.status();
}

}  // namespace
}  // namespace summa
