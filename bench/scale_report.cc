#include "bench/scale_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"

namespace summa::bench {
namespace {

// The values of SyntheticInitialValue's pattern: i % 251 / 16.
constexpr int kPatternPeriod = 251;

bool IsFloat(double x) { return static_cast<double>(static_cast<float>(x)) == x; }

std::string Cell(const std::optional<double>& value, const char* format) {
  return value ? absl::StrFormat(format, *value) : "-";
}

}  // namespace

absl::StatusOr<float> ExpectedFirstWeight(int world, int64_t steps, double lr) {
  if (world < 1 || steps < 1) return absl::InvalidArgumentError("needs at least one worker and one step");
  int exponent = 0;
  if (!(lr > 0) || std::frexp(lr, &exponent) != 0.5 || !IsFloat(lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr=", lr, " is not a power of two (e.g. 0.0009765625 = 2^-10): the weights' exact "
        "expected value needs every product with it to be exact in float32"));
  }
  // One step's move and its parts, and every weight of the pattern after every step.
  const double per_step = worker::SyntheticShift(world, 1, lr);
  const double summed = 0.5 * world * (world + 1.0);
  bool exact = IsFloat(summed) && IsFloat(per_step) && IsFloat(per_step / lr);
  for (int k = 0; exact && k < kPatternPeriod; ++k) {
    const double initial = worker::SyntheticInitialValue(k);
    for (int64_t s = 1; exact && s <= steps; ++s) exact = IsFloat(initial - static_cast<double>(s) * per_step);
  }
  if (!exact) {
    return absl::InvalidArgumentError(absl::StrCat(
        world, " workers x ", steps, " steps at lr ", lr, " take the weights past float32's 24 bits, "
        "so the final weight has no exact expected value: use fewer steps or a smaller lr"));
  }
  return static_cast<float>(worker::SyntheticInitialValue(0) - worker::SyntheticShift(world, steps, lr));
}

double PsModelSeconds(int64_t model_bytes, int workers, int shards, double bandwidth) {
  const double m = static_cast<double>(model_bytes);
  return std::max(m / bandwidth, workers * m / (shards * bandwidth));
}

double FitBandwidth(int64_t model_bytes, double one_worker_step_seconds) {
  return static_cast<double>(model_bytes) / one_worker_step_seconds;
}

std::string ScaleTableHeader(bool reference) {
  return absl::StrCat(
      "| workers | k | model | step time (ms, median of slowest) | PS model, B fitted (ms) | ",
      reference ? "PS model, B reference (ms) | " : "",
      "per shard in (MiB/step) | per shard out (MiB/step) | through a shard (GB/s, in+out) | "
      "per shard CPU (s/step) | workers CPU (s/step, all) | largest shard peak RSS (MiB) | load avg at start | "
      "correct |\n",
      "|---:|---:|---:|---:|---:|", reference ? "---:|" : "", "---:|---:|---:|---:|---:|---:|---:|---|");
}

std::string FormatScaleRow(const ScaleRow& row, bool reference) {
  std::optional<double> through;
  if (row.step_ms && row.server_in_mib && row.server_out_mib && *row.step_ms > 0) {
    through = (*row.server_in_mib + *row.server_out_mib) * (1 << 20) / (*row.step_ms * 1e-3) / 1e9;
  }
  const std::string correct = row.correct ? "yes" : row.note.empty() ? "no" : row.note;
  return absl::StrCat("| ", row.workers, " | ", row.shards, " | ", FormatByteSize(row.model_bytes), " | ",
                      Cell(row.step_ms, "%.1f"), " | ", Cell(row.model_ms, "%.1f"), " | ",
                      reference ? absl::StrCat(Cell(row.reference_ms, "%.1f"), " | ") : "",
                      Cell(row.server_in_mib, "%.1f"), " | ", Cell(row.server_out_mib, "%.1f"), " | ",
                      Cell(through, "%.3f"), " | ", Cell(row.server_cpu_s, "%.4f"), " | ",
                      Cell(row.workers_cpu_s, "%.3f"), " | ", Cell(row.server_peak_rss_mib, "%.1f"), " | ",
                      Cell(row.load_average, "%.1f"), " | ", correct, " |");
}

absl::StatusOr<double> MedianSlowestStepUs(const std::vector<worker::SyntheticResult>& workers) {
  if (workers.empty()) return absl::InvalidArgumentError("no worker reported");
  const size_t steps = workers[0].step_us.size();
  if (steps < 2) return absl::InvalidArgumentError("needs at least 2 steps (step 0 is not timed)");
  std::vector<double> slowest(steps - 1, 0.0);
  for (const worker::SyntheticResult& w : workers) {
    if (w.step_us.size() != steps) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", w.rank, " reported ", w.step_us.size(),
                                                     " steps, rank ", workers[0].rank, " ", steps));
    }
    for (size_t k = 1; k < steps; ++k) slowest[k - 1] = std::max(slowest[k - 1], w.step_us[k]);
  }
  std::sort(slowest.begin(), slowest.end());
  const size_t mid = slowest.size() / 2;
  return slowest.size() % 2 == 1 ? slowest[mid] : (slowest[mid - 1] + slowest[mid]) / 2;
}

std::string CheckSyntheticResult(const worker::SyntheticResult& r, int rank, int world, int64_t steps,
                                 int64_t model_bytes, float expected) {
  if (r.rank != rank || r.world != world) {
    return absl::StrCat("reported rank ", r.rank, " of ", r.world, ", expected ", rank, " of ", world);
  }
  if (r.steps != steps) return absl::StrCat("rank ", rank, " ran ", r.steps, " steps, not ", steps);
  if (r.params * 4 != model_bytes || r.push_bytes_per_step != model_bytes || r.pull_bytes_per_step != model_bytes) {
    return absl::StrCat("rank ", rank, " held ", r.params, " parameters and pushed ", r.push_bytes_per_step,
                        " / pulled ", r.pull_bytes_per_step, " bytes per step; the model has ", model_bytes);
  }
  if (r.first_weight != expected) {
    return absl::StrFormat("rank %d ended with first weight %.9g, expected exactly %.9g", rank,
                           r.first_weight, expected);
  }
  if (!r.uniform) return absl::StrCat("rank ", rank, ": some weights did not move as the first did");
  return "";
}

std::string PlotData(const std::vector<ScaleRow>& rows) {
  std::string out = "workers\tshards\tmodel_bytes\tstep_ms\tmodel_ms\treference_ms\n";
  auto value = [](const std::optional<double>& v) { return v ? absl::StrFormat("%.6f", *v) : std::string(); };
  for (const ScaleRow& r : rows) {
    absl::StrAppend(&out, r.workers, "\t", r.shards, "\t", r.model_bytes, "\t", value(r.step_ms), "\t",
                    value(r.model_ms), "\t", value(r.reference_ms), "\n");
  }
  return out;
}

}  // namespace summa::bench
