#include "bench/allreduce_report.h"

#include "gtest/gtest.h"

namespace summa::bench {
namespace {

TEST(AllReduceReportTest, RankReportLineRoundTrips) {
  RankReport r;
  r.bytes = 1 << 20;
  r.rank = 3;
  r.correct = false;
  r.times_us = {12.5, 7.25};
  r.detail = "element 5 of iteration 1 is 3, expected 6";
  const std::string line = FormatRankReport(r);
  auto parsed = ParseRankReports("some log line\n" + line + "\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_EQ((*parsed)[0].bytes, r.bytes);
  EXPECT_EQ((*parsed)[0].rank, 3);
  EXPECT_FALSE((*parsed)[0].correct);
  EXPECT_EQ((*parsed)[0].times_us, r.times_us);
  EXPECT_EQ((*parsed)[0].detail, r.detail);
  EXPECT_FALSE(ParseRankReports("result bytes=4 rank=0 times_us=1").ok());  // no correct=
}

TEST(AllReduceReportTest, MedianOfTheSlowestRankPerIteration) {
  RankReport a, b;
  a.times_us = {10, 50, 30};
  b.times_us = {20, 40, 90};
  // slowest per iteration: 20, 50, 90
  EXPECT_DOUBLE_EQ(*MedianOfSlowestRankUs({a, b}), 50);
  a.times_us.push_back(1);
  b.times_us.push_back(60);  // slowest: 20, 50, 90, 60
  EXPECT_DOUBLE_EQ(*MedianOfSlowestRankUs({a, b}), 55);
  b.times_us.pop_back();
  EXPECT_FALSE(MedianOfSlowestRankUs({a, b}).ok());
  EXPECT_FALSE(MedianOfSlowestRankUs({}).ok());
}

TEST(AllReduceReportTest, BandwidthsFollowNcclTests) {
  // 1 GB in 1 s: algbw 1 GB/s; busbw times 2(n-1)/n.
  EXPECT_DOUBLE_EQ(AlgorithmBandwidthGBps(1000000000, 1e6), 1.0);
  EXPECT_DOUBLE_EQ(BusBandwidthGBps(1000000000, 1e6, 2), 1.0);
  EXPECT_DOUBLE_EQ(BusBandwidthGBps(1000000000, 1e6, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBandwidthGBps(1000000000, 1e6, 1), 0.0);
}

}  // namespace
}  // namespace summa::bench
