// The scaling benchmark's arithmetic (bench/scale_report.h): the exact expected weight and when
// there is none, the parameter-server model, the step-time statistic, the checks of a worker's
// result, and the table.
#include "bench/scale_report.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace summa::bench {
namespace {

TEST(ScaleReportTest, ExpectedFirstWeightIsExact) {
  constexpr double kLr = 1.0 / 1024;
  for (int n : {1, 2, 4, 8, 16, 32}) {
    // A power-of-two world pushes 1 example per worker: the mean gradient is (N+1)/2.
    auto w = ExpectedFirstWeight(n, 20, kLr);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, static_cast<float>(-20 * kLr * (n + 1) / 2)) << n;
  }
  // 13 workers push 16 examples in all (rank 0 pushes 4): the mean is 91/16.
  EXPECT_EQ(*ExpectedFirstWeight(13, 3, kLr), static_cast<float>(-3 * kLr * 91 / 16));
  EXPECT_EQ(*ExpectedFirstWeight(2, 1, 0.5), -0.75f);
}

TEST(ScaleReportTest, NoExpectedWeightWhereFloatArithmeticWouldRound) {
  auto lr = ExpectedFirstWeight(2, 20, 0.001);
  EXPECT_EQ(lr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lr.status().message().find("power of two"), absl::string_view::npos) << lr.status();
  auto long_run = ExpectedFirstWeight(190, 975, 1.0 / 1024);
  EXPECT_EQ(long_run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_run.status().message().find("24 bits"), absl::string_view::npos) << long_run.status();
  EXPECT_FALSE(ExpectedFirstWeight(0, 20, 1.0 / 1024).ok());
  EXPECT_FALSE(ExpectedFirstWeight(2, 0, 1.0 / 1024).ok());
}

TEST(ScaleReportTest, PsModelIsTheSlowerOfWorkerAndServerLinks) {
  const int64_t m = 1000;
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 1, 1, 100), 10);
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 8, 1, 100), 80);
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 8, 4, 100), 20);
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 2, 4, 100), 10);  // the worker's own link bounds it
  // B fitted to one worker reproduces that worker's time.
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 1, 1, FitBandwidth(m, 0.25)), 0.25);
  EXPECT_DOUBLE_EQ(PsModelSeconds(m, 16, 1, FitBandwidth(m, 0.25)), 4.0);
}

worker::SyntheticResult Result(int rank, std::vector<double> steps) {
  worker::SyntheticResult r;
  r.rank = rank;
  r.world = 2;
  r.params = 256;
  r.steps = static_cast<int64_t>(steps.size());
  r.push_bytes_per_step = r.pull_bytes_per_step = 1024;
  r.first_weight = -0.5f;
  r.uniform = true;
  r.step_us = std::move(steps);
  return r;
}

TEST(ScaleReportTest, StepTimeIsTheMedianOfTheSlowestAfterStepZero) {
  // Step 0 (1000) is left out; the slowest per step are 30, 50, 20 -> median 30.
  EXPECT_DOUBLE_EQ(*MedianSlowestStepUs({Result(0, {1000, 30, 10, 20}), Result(1, {5, 10, 50, 15})}), 30);
  EXPECT_DOUBLE_EQ(*MedianSlowestStepUs({Result(0, {1, 10, 20})}), 15);
  EXPECT_FALSE(MedianSlowestStepUs({Result(0, {1, 2}), Result(1, {1, 2, 3})}).ok());
  EXPECT_FALSE(MedianSlowestStepUs({Result(0, {1})}).ok());
  EXPECT_FALSE(MedianSlowestStepUs({}).ok());
}

TEST(ScaleReportTest, ChecksEveryPartOfAWorkersResult) {
  const worker::SyntheticResult good = Result(1, {1, 2, 3});
  EXPECT_EQ(CheckSyntheticResult(good, 1, 2, 3, 1024, -0.5f), "");
  EXPECT_NE(CheckSyntheticResult(good, 1, 2, 3, 1024, -0.25f).find("expected exactly -0.25"), std::string::npos);
  EXPECT_NE(CheckSyntheticResult(good, 0, 2, 3, 1024, -0.5f), "");
  EXPECT_NE(CheckSyntheticResult(good, 1, 2, 4, 1024, -0.5f), "");
  EXPECT_NE(CheckSyntheticResult(good, 1, 2, 3, 2048, -0.5f), "");
  worker::SyntheticResult skewed = good;
  skewed.uniform = false;
  EXPECT_NE(CheckSyntheticResult(skewed, 1, 2, 3, 1024, -0.5f).find("did not move"), std::string::npos);
}

TEST(ScaleReportTest, TableRows) {
  ScaleRow row;
  row.workers = 4;
  row.model_bytes = 64 << 20;
  row.step_ms = 1000;
  row.model_ms = 800;
  row.server_in_mib = 256;
  row.server_out_mib = 256;
  row.server_cpu_s = 1.25;
  row.workers_cpu_s = 0.5;
  row.server_peak_rss_mib = 700;
  row.load_average = 2.25;
  row.correct = true;
  EXPECT_EQ(FormatScaleRow(row, false),
            "| 4 | 1 | 64MiB | 1000.0 | 800.0 | 256.0 | 256.0 | 0.537 | 1.2500 | 0.500 | 700.0 | 2.2 | yes |");
  EXPECT_EQ(FormatScaleRow(row, true),
            "| 4 | 1 | 64MiB | 1000.0 | 800.0 | - | 256.0 | 256.0 | 0.537 | 1.2500 | 0.500 | 700.0 | 2.2 | yes |");
  ScaleRow failed;
  failed.workers = 32;
  failed.model_bytes = 1 << 30;
  failed.note = "FAILED [1]";
  EXPECT_EQ(FormatScaleRow(failed, false), "| 32 | 1 | 1GiB | - | - | - | - | - | - | - | - | - | FAILED [1] |");
  // Every row has as many cells as the header.
  for (bool reference : {false, true}) {
    const std::string header = ScaleTableHeader(reference);
    const std::string first_line = header.substr(0, header.find('\n'));
    auto cells = [](const std::string& s) { return std::count(s.begin(), s.end(), '|'); };
    EXPECT_EQ(cells(first_line), cells(FormatScaleRow(row, reference)));
    EXPECT_EQ(cells(header.substr(header.find('\n') + 1)), cells(first_line));
  }
  EXPECT_EQ(PlotData({row, failed}),
            "workers\tshards\tmodel_bytes\tstep_ms\tmodel_ms\treference_ms\n"
            "4\t1\t67108864\t1000.000000\t800.000000\t\n"
            "32\t1\t1073741824\t\t\t\n");
}

}  // namespace
}  // namespace summa::bench
