#include "bench/allreduce_rank.h"

#include "gtest/gtest.h"

namespace summa::bench {
namespace {

// An in-process group of `n` ranks whose sum is computed from the fill itself.
Exchange ExactSum(int n, int& iteration) {
  return [n, &iteration](const std::vector<float>& in, std::vector<float>& out) {
    std::vector<float> other(in.size());
    out.assign(in.size(), 0.0f);
    for (int r = 0; r < n; ++r) {
      FillContribution(r, iteration, absl::MakeSpan(other));
      for (size_t i = 0; i < in.size(); ++i) out[i] += other[i];
    }
    ++iteration;
    return absl::OkStatus();
  };
}

RankOptions Options(int group_size) {
  RankOptions o;
  o.group_size = group_size;
  o.rank = 0;
  o.bytes = 4 * 1000;
  o.warmup = 2;
  o.iters = 3;
  return o;
}

TEST(AllReduceRankTest, FillSumsExactlyAndChangesEveryIteration) {
  std::vector<float> a(200), b(200);
  FillContribution(1, 0, absl::MakeSpan(a));
  EXPECT_EQ(a[0], 2.0f);
  EXPECT_EQ(a[96], 2.0f * 97);
  EXPECT_EQ(a[97], 2.0f);
  FillContribution(1, 1, absl::MakeSpan(b));
  EXPECT_EQ(b[0], 4.0f);
  std::vector<float> sum(200, 0.0f);
  for (int r = 0; r < 8; ++r) {
    FillContribution(r, 5, absl::MakeSpan(a));
    for (size_t i = 0; i < a.size(); ++i) sum[i] += a[i];
  }
  EXPECT_EQ(FirstWrongElement(8, 5, sum), -1);
  EXPECT_EQ(FirstWrongElement(8, 4, sum), 0);  // last round's sum is caught
  sum[150] += 1;
  EXPECT_EQ(FirstWrongElement(8, 5, sum), 150);
}

TEST(AllReduceRankTest, ReportsTimesOfTheTimedCallsOnly) {
  int iteration = 0;
  auto report = RunRank(Options(3), ExactSum(3, iteration));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->correct) << report->detail;
  EXPECT_EQ(report->times_us.size(), 3u);
  EXPECT_EQ(iteration, 5);
}

TEST(AllReduceRankTest, OneWrongElementMakesTheRankIncorrect) {
  int iteration = 0;
  Exchange exact = ExactSum(2, iteration);
  auto report = RunRank(Options(2), [&](const std::vector<float>& in, std::vector<float>& out) {
    const int k = iteration;
    absl::Status s = exact(in, out);
    if (k == 3) out[999] = 0;  // a timed iteration's last element
    return s;
  });
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->correct);
  EXPECT_EQ(report->detail, "element 999 of iteration 3 is 0, expected 99");  // 3 * ((999 + 3) % 97 + 1)
  EXPECT_EQ(report->times_us.size(), 3u);
}

TEST(AllReduceRankTest, AFailedExchangeFailsTheRank) {
  auto report = RunRank(Options(2), [](const std::vector<float>&, std::vector<float>&) {
    return absl::UnavailableError("server gone");
  });
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace summa::bench
