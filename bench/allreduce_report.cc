#include "bench/allreduce_report.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace summa::bench {
namespace {

absl::Status BadLine(absl::string_view line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad result line (", why, "): '", line, "'"));
}

}  // namespace

std::string FormatRankReport(const RankReport& report) {
  std::string line = absl::StrCat(
      "result bytes=", report.bytes, " rank=", report.rank, " correct=", report.correct ? "yes" : "no",
      " times_us=",
      absl::StrJoin(report.times_us, ",", [](std::string* out, double t) {
        absl::StrAppendFormat(out, "%.3f", t);
      }));
  if (report.server_faults >= 0) absl::StrAppend(&line, " server_faults=", report.server_faults);
  if (!report.detail.empty()) absl::StrAppend(&line, " detail=", report.detail);
  return line;
}

absl::StatusOr<std::vector<RankReport>> ParseRankReports(absl::string_view output) {
  std::vector<RankReport> reports;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "result ")) continue;
    RankReport r;
    const size_t detail = rest.find(" detail=");
    if (detail != absl::string_view::npos) {
      r.detail = std::string(rest.substr(detail + 8));
      rest = rest.substr(0, detail);
    }
    bool have_bytes = false, have_rank = false, have_correct = false, have_times = false;
    for (absl::string_view field : absl::StrSplit(rest, ' ', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      if (kv.first == "bytes") {
        have_bytes = absl::SimpleAtoi(kv.second, &r.bytes);
      } else if (kv.first == "server_faults") {
        if (!absl::SimpleAtoi(kv.second, &r.server_faults)) r.server_faults = -1;
      } else if (kv.first == "rank") {
        have_rank = absl::SimpleAtoi(kv.second, &r.rank);
      } else if (kv.first == "correct") {
        have_correct = kv.second == "yes" || kv.second == "no";
        r.correct = kv.second == "yes";
      } else if (kv.first == "times_us") {
        have_times = true;
        for (absl::string_view t : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
          double value = 0;
          if (!absl::SimpleAtod(t, &value)) return BadLine(line, "a time is not a number");
          r.times_us.push_back(value);
        }
      }
    }
    if (!have_bytes || !have_rank || !have_correct || !have_times) {
      return BadLine(line, "needs bytes, rank, correct and times_us");
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

absl::StatusOr<double> MedianOfSlowestRankUs(const std::vector<RankReport>& ranks) {
  if (ranks.empty()) return absl::InvalidArgumentError("no rank reported");
  const size_t iterations = ranks[0].times_us.size();
  if (iterations == 0) return absl::InvalidArgumentError("no timed iteration");
  std::vector<double> slowest(iterations, 0.0);
  for (const RankReport& r : ranks) {
    if (r.times_us.size() != iterations) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank, " reported ", r.times_us.size(),
                                                     " iterations, rank ", ranks[0].rank, " ", iterations));
    }
    for (size_t i = 0; i < iterations; ++i) slowest[i] = std::max(slowest[i], r.times_us[i]);
  }
  std::sort(slowest.begin(), slowest.end());
  const size_t mid = iterations / 2;
  return iterations % 2 == 1 ? slowest[mid] : (slowest[mid - 1] + slowest[mid]) / 2;
}

double AlgorithmBandwidthGBps(int64_t bytes, double time_us) {
  return static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
}

double BusBandwidthGBps(int64_t bytes, double time_us, int ranks) {
  return AlgorithmBandwidthGBps(bytes, time_us) * 2.0 * (ranks - 1) / ranks;
}

std::string TableHeader() {
  return "| impl | ranks | size | time (µs, median) | algbw (GB/s) | busbw (GB/s) | correct | "
         "server peak RSS (MiB) | server minor faults per call |\n"
         "|---|---:|---:|---:|---:|---:|---|---:|---:|";
}

std::string FormatTableRow(const TableRow& row) {
  const std::string size = row.bytes > 0 ? FormatByteSize(row.bytes) : "-";
  std::string time = "-", algbw = "-", busbw = "-";
  if (row.time_us) {
    time = absl::StrFormat("%.1f", *row.time_us);
    algbw = absl::StrFormat("%.4f", AlgorithmBandwidthGBps(row.bytes, *row.time_us));
    busbw = absl::StrFormat("%.4f", BusBandwidthGBps(row.bytes, *row.time_us, row.ranks));
  }
  const std::string correct = row.correct ? "yes" : row.note.empty() ? "no" : row.note;
  const std::string rss =
      row.server_peak_rss_mib ? absl::StrFormat("%.1f", *row.server_peak_rss_mib) : "-";
  const std::string faults =
      row.server_faults_per_call ? absl::StrFormat("%.1f", *row.server_faults_per_call) : "-";
  return absl::StrCat("| ", row.impl, " | ", row.ranks, " | ", size, " | ", time, " | ", algbw,
                      " | ", busbw, " | ", correct, " | ", rss, " | ", faults, " |");
}

}  // namespace summa::bench
