#include "client/push_encoder.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace summa::worker {
namespace {

// Two partitions of 6 and 4 values, top-k 25% (k = 2 and 1) in float32, so that what is sent and
// kept can be written down.
std::vector<PartitionRange> TwoPartitions() { return {{0, 0, 6}, {1, 6, 4}}; }

Compression TopK(double ratio) {
  Compression c;
  c.topk_ratio = ratio;
  return c;
}

std::vector<float> Residuals(const PushEncoder& e) {
  std::vector<float> all;
  for (size_t i = 0; i < 2; ++i) all.insert(all.end(), e.residual(i).begin(), e.residual(i).end());
  return all;
}

std::vector<std::string> Bytes(const PushEncoder& e) {
  return {std::string(e.bytes(0)), std::string(e.bytes(1))};
}

const std::vector<float> kStep0 = {5, 1, 1, 1, 1, 4, 3, 1, 1, 1};
const std::vector<float> kStep1 = {1, 1, 2, 1, 1, 1, 1, 1, 1, 1};
// acc = [1, 2, 3, 2, 2, 1 | 1, 2, 2, 2]: 3 and the first 2 go out of the first partition (equal
// magnitudes: the first position wins), the first 2 of the second.
const std::vector<float> kAfterStep1 = {1, 0, 0, 2, 2, 1, 1, 0, 2, 2};

class PushEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e_.Configure(TwoPartitions(), WireDType::kFloat32, TopK(0.25));
    EXPECT_EQ(e_.Rejoined(0), "");
    e_.Encode(0, 64, kStep0.data());
    after_step0_ = Residuals(e_);
    // Sent: 5 and 4 of the first partition, 3 of the second; kept: the rest.
    EXPECT_EQ(after_step0_, (std::vector<float>{0, 1, 1, 1, 1, 0, 0, 1, 1, 1}));
    e_.Encode(1, 64, kStep1.data());
    step1_bytes_ = Bytes(e_);
    EXPECT_EQ(Residuals(e_), kAfterStep1);
  }

  PushEncoder e_;
  std::vector<float> after_step0_;
  std::vector<std::string> step1_bytes_;
};

TEST_F(PushEncoderTest, AResendCarriesTheSameBytesAndCountsTheStepOnce) {
  e_.Encode(1, 64, kStep1.data());
  EXPECT_EQ(Bytes(e_), step1_bytes_);
  EXPECT_EQ(Residuals(e_), kAfterStep1);
}

TEST_F(PushEncoderTest, TheSameStepFromOtherExamplesIsEncodedAgainFromTheResidualBefore) {
  const std::vector<float> other = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  e_.Encode(1, 32, other.data());
  // From step 0's residual, not step 1's: [0, 1, 1, 1, 1, 0 | 0, 1, 1, 1], the first two 1s out
  // of the first partition and the first of the second.
  EXPECT_EQ(Residuals(e_), (std::vector<float>{0, 0, 0, 1, 1, 0, 0, 0, 1, 1}));
}

TEST_F(PushEncoderTest, ARejoinWhereTheServerHasTheStepKeepsTheResiduals) {
  EXPECT_EQ(e_.Rejoined(2), "");
  e_.Configure(TwoPartitions(), WireDType::kFloat32, TopK(0.25));
  EXPECT_EQ(Residuals(e_), kAfterStep1);
}

TEST_F(PushEncoderTest, ARejoinWhereTheServerLacksTheStepTakesItBackAndEncodesItAgainAlike) {
  e_.Configure(TwoPartitions(), WireDType::kFloat32, TopK(0.25));
  EXPECT_EQ(e_.Rejoined(1), "");
  EXPECT_EQ(Residuals(e_), after_step0_);
  // The step recomputed from the same weights is the same gradient: the same push.
  e_.Encode(1, 64, kStep1.data());
  EXPECT_EQ(Bytes(e_), step1_bytes_);
  EXPECT_EQ(Residuals(e_), kAfterStep1);
}

TEST_F(PushEncoderTest, AServerThatWentBackFurtherDropsTheResiduals) {
  const std::string line = e_.Rejoined(0);
  EXPECT_NE(line.find("expects step 0 where this worker's residuals lead to step 2"), std::string::npos) << line;
  EXPECT_EQ(Residuals(e_), std::vector<float>(10, 0.0f));
  e_.Encode(0, 64, kStep0.data());
  EXPECT_EQ(Residuals(e_), after_step0_);
}

TEST_F(PushEncoderTest, ASecondRejoinBeforeAnyPushJudgesFromWhatTheFirstLeft) {
  // The server has step 1, then (restored again) lacks it: taken back at the second rejoin.
  EXPECT_EQ(e_.Rejoined(2), "");
  EXPECT_EQ(e_.Rejoined(1), "");
  EXPECT_EQ(Residuals(e_), after_step0_);
  // The same rejoin again changes nothing; a step further back cannot be taken back: dropped.
  EXPECT_EQ(e_.Rejoined(1), "");
  EXPECT_EQ(Residuals(e_), after_step0_);
  EXPECT_NE(e_.Rejoined(0), "");
  EXPECT_EQ(Residuals(e_), std::vector<float>(10, 0.0f));
  // From zero residuals, any step is a fresh start.
  EXPECT_EQ(e_.Rejoined(5), "");
}

TEST_F(PushEncoderTest, AJobThatWentOnWithoutThisRankDropsTheResiduals) {
  EXPECT_NE(e_.Rejoined(7), "");
  EXPECT_EQ(Residuals(e_), std::vector<float>(10, 0.0f));
}

TEST_F(PushEncoderTest, AnotherFormatOrOtherPartitionsStartAfresh) {
  e_.Configure(TwoPartitions(), WireDType::kBfloat16, TopK(0.25));
  EXPECT_EQ(Residuals(e_), std::vector<float>(10, 0.0f));
  e_.Encode(1, 64, kStep1.data());  // step 1 again, but nothing is held in this format
  EXPECT_EQ(e_.bytes(0).size(), 2u * (4 + 2));
  e_.Configure({{0, 0, 10}}, WireDType::kBfloat16, TopK(0.25));
  EXPECT_EQ(e_.residual(0), absl::Span<const float>(std::vector<float>(10, 0.0f)));
}

TEST(PushEncoderDenseTest, DenseFormatsEncodeEveryValueAndFloat32NeedsNoEncoding) {
  PushEncoder e;
  e.Configure({{0, 0, 3}}, WireDType::kFloat32, Compression());
  EXPECT_TRUE(e.dense_float32());
  e.Configure({{0, 0, 3}}, WireDType::kBfloat16, Compression());
  EXPECT_FALSE(e.dense_float32());
  const std::vector<float> g = {1.0f, -2.0f, 0.5f};
  e.Encode(0, 1, g.data());
  uint16_t half[3];
  ASSERT_EQ(e.bytes(0).size(), sizeof(half));
  std::memcpy(half, e.bytes(0).data(), sizeof(half));
  EXPECT_EQ(half[0], 0x3f80);
  EXPECT_EQ(half[1], 0xc000);
  EXPECT_EQ(half[2], 0x3f00);
  EXPECT_TRUE(e.residual(0).empty());
}

}  // namespace
}  // namespace summa::worker
