#include "bench/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/invocation.h"
#include "common/status_macros.h"
#include "worker/models/model.h"

namespace summa::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The rate of C[m,n] = A[m,k] B[k,n] on `backend`, the best of `reps` after one warm-up.
absl::StatusOr<double> GemmGflops(worker::Backend& backend, int m, int n, int k, int reps) {
  std::vector<float> a(int64_t{m} * k, 0.5f), b(int64_t{k} * n, 0.25f), c(int64_t{m} * n);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const Clock::time_point start = Clock::now();
    SUMMA_RETURN_IF_ERROR(backend.Gemm(false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data()));
    if (r > 0) best = std::min(best, Seconds(start));
  }
  if (c[0] != 0.125f * k) return absl::InternalError(absl::StrCat("sgemm gave ", c[0], ", want ", 0.125f * k));
  return 2.0 * m * n * k / best / 1e9;
}

// LeNet's matrix products per example: forward, then backward (conv1 computes no dx).
constexpr double kLeNetForwardFlops = 2.0 * (20 * 676 * 9 + 50 * 81 * 500 + 800 * 128 + 128 * 10);
constexpr double kLeNetBackwardFlops =
    2.0 * (20 * 676 * 9 + 2 * 50 * 81 * 500 + 2 * 800 * 128 + 2 * 128 * 10);
// Of which conv2's three products (forward, backward-data, backward-weights) per example.
constexpr double kLeNetConv2Flops = 3 * 2.0 * 50 * 81 * 500;

// LeNet's matrix products in one step of `batch` examples in chunks of `chunk`, with conv2 as
// `conv` computes it: Winograd's 49 products of [50, 20] by [20, T] per direction, T the
// chunk's 3x3 output tiles, images padded to groups of 16.
double LeNetStepFlops(int batch, int chunk, worker::ConvMethod conv) {
  const double direct = batch * (kLeNetForwardFlops + kLeNetBackwardFlops);
  if (conv == worker::ConvMethod::kIm2col) return direct;
  double winograd = 0;
  for (int first = 0; first < batch; first += chunk) {
    const int b = std::min(chunk, batch - first);
    const worker::ConvShape conv2{b, 20, 13, 13, 50, 5};
    winograd += 3 * worker::winograd::kPoints * 2.0 * 50 * 20 * conv2.winograd().columns;
  }
  return direct - batch * kLeNetConv2Flops + winograd;
}

}  // namespace

absl::Status ValidateLayerProfileOptions(const LayerProfileOptions& o) {
  if (o.batch < 1) return absl::InvalidArgumentError(absl::StrCat("--batch must be at least 1, got ", o.batch));
  if (o.chunk < 0) return absl::InvalidArgumentError(absl::StrCat("--chunk must not be negative, got ", o.chunk));
  if (o.steps < 1) return absl::InvalidArgumentError(absl::StrCat("--steps must be at least 1, got ", o.steps));
  if (o.warmup < 0) return absl::InvalidArgumentError(absl::StrCat("--warmup must not be negative, got ", o.warmup));
  if (o.threads < 1) return absl::InvalidArgumentError(absl::StrCat("--threads must be at least 1, got ", o.threads));
  return worker::ModelSpecs(o.model).status();
}

absl::StatusOr<LayerProfile> ProfileLayers(const LayerProfileOptions& o) {
  SUMMA_RETURN_IF_ERROR(ValidateLayerProfileOptions(o));
  LayerProfile result;
  worker::CpuProfile warm;
  std::unique_ptr<worker::Backend> backend = worker::NewCpuBackend(o.threads, &warm, o.conv);
  const int chunk = o.chunk > 0 ? o.chunk : backend->preferred_chunk();
  result.chunk = chunk;
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<worker::Model> model,
                         worker::NewModel(o.model, backend.get(), o.batch, chunk));
  // A table of 4 batches of examples, drawn from in a shuffled order, as the trainer does.
  const int64_t image_floats = model->image_floats();
  const int64_t table_rows = 4 * int64_t{o.batch};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(table_rows * image_floats), labels(table_rows), order(table_rows);
  for (float& v : images) v = pixel(rng);
  for (int64_t i = 0; i < table_rows; ++i) {
    labels[i] = static_cast<float>(i % model->classes());
    order[i] = static_cast<float>(i);
  }
  std::shuffle(order.begin(), order.end(), rng);
  const std::vector<float> weights = model->InitialWeights(0);
  std::vector<float> gradient(weights.size());

  auto step = [&](int s) -> absl::Status {
    SUMMA_RETURN_IF_ERROR(model->SetWeights(weights.data()));
    const float* rows = order.data() + (s % 4) * int64_t{o.batch};
    SUMMA_RETURN_IF_ERROR(
        model->ComputeGradients(worker::Examples::Resident(images.data(), labels.data(), rows), o.batch));
    return model->GetGradients(gradient.data());
  };
  for (int s = 0; s < o.warmup; ++s) SUMMA_RETURN_IF_ERROR(step(s));
  SUMMA_RETURN_IF_ERROR(model->TakeLoss().status());
  warm.clear();
  const Clock::time_point start = Clock::now();
  for (int s = 0; s < o.steps; ++s) SUMMA_RETURN_IF_ERROR(step(o.warmup + s));
  result.step_seconds = Seconds(start) / o.steps;
  result.phases = warm;
  SUMMA_ASSIGN_OR_RETURN(result.loss, model->TakeLoss());

  SUMMA_ASSIGN_OR_RETURN(result.square_gflops, GemmGflops(*backend, 2048, 2048, 2048, 3));
  // conv2's forward product at this chunk: [50, 500] x [500, chunk * 81].
  SUMMA_ASSIGN_OR_RETURN(result.conv2_gflops, GemmGflops(*backend, 50, chunk * 81, 500, 20));
  return result;
}

std::string FormatLayerProfile(const LayerProfileOptions& o, const LayerProfile& p, bool* ok) {
  const int chunk = p.chunk;
  std::string out = absl::StrCat("Command: ", o.command_line, "\n", DescribeEnvironment(), "\n\n");
  absl::StrAppendFormat(&out,
                        "Model %s, batch %d in chunks of %d, %d OpenBLAS thread(s), convolutions %s, %d "
                        "timed steps. "
                        "This core's sgemm: %.1f GFLOP/s at 2048x2048x2048, %.1f GFLOP/s at conv2's "
                        "product (50x500 by 500x%d).\n\n",
                        o.model, o.batch, chunk, o.threads,
                        o.conv == worker::ConvMethod::kFastest
                            ? "5x5 by Winograd F(3x3, 5x5), single-channel 3x3 directly"
                            : "all by im2col",
                        o.steps, p.square_gflops, p.conv2_gflops,
                        chunk * 81);
  struct Row {
    std::string name;
    worker::CpuPhase phase;
  };
  std::vector<Row> rows;
  double covered = 0, flops = 0, gemm_seconds = 0;
  for (const auto& [name, phase] : p.phases) {
    rows.push_back({name, phase});
    covered += phase.seconds;
    flops += phase.flops;
    if (phase.flops > 0) gemm_seconds += phase.seconds;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.phase.seconds > b.phase.seconds; });
  const double step_ms = 1e3 * p.step_seconds;
  out += "| phase | calls per step | ms per step | % of step | GFLOP/s | % of the 2048^3 rate |\n";
  out += "|---|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    const double ms = 1e3 * r.phase.seconds / o.steps;
    std::string rate = "", share = "";
    if (r.phase.flops > 0) {
      const double gflops = r.phase.flops / r.phase.seconds / 1e9;
      rate = absl::StrFormat("%.1f", gflops);
      share = absl::StrFormat("%.0f%%", 100 * gflops / p.square_gflops);
    }
    absl::StrAppendFormat(&out, "| %s | %.1f | %.3f | %.1f%% | %s | %s |\n", r.name,
                          static_cast<double>(r.phase.calls) / o.steps, ms, 100 * ms / step_ms, rate, share);
  }
  const double per_step_flops = flops / o.steps;
  absl::StrAppendFormat(&out,
                        "| **step** (wall) | | %.3f | 100%% | %.1f | %.0f%% |\n\n"
                        "Matrix products: %.1f%% of the step at %.1f GFLOP/s. A 60000-example epoch "
                        "at this step time: %.1f s.\n\n",
                        step_ms, per_step_flops / p.step_seconds / 1e9,
                        100 * per_step_flops / p.step_seconds / 1e9 / p.square_gflops,
                        100 * gemm_seconds / o.steps / p.step_seconds, flops / gemm_seconds / 1e9,
                        p.step_seconds * 60000.0 / o.batch);
  std::vector<std::pair<std::string, bool>> checks;
  const double coverage = covered / o.steps / p.step_seconds;
  checks.push_back({absl::StrFormat("the phases cover 80%% to 102%% of the step (%.1f%%)", 100 * coverage),
                    coverage >= 0.8 && coverage <= 1.02});
  if (o.model == "lenet") {
    const double want = LeNetStepFlops(o.batch, chunk, o.conv);
    checks.push_back({absl::StrFormat("the products add up to LeNet's %.2f MFLOP per example (%.2f; "
                                      "%.2f by im2col)",
                                      want / o.batch / 1e6, per_step_flops / o.batch / 1e6,
                                      kLeNetForwardFlops / 1e6 + kLeNetBackwardFlops / 1e6),
                      std::abs(per_step_flops - want) <= 1e-9 * want});
  }
  checks.push_back({absl::StrFormat("the loss is finite and positive (%.3f per example)",
                                    p.loss / (o.batch * double(o.steps))),
                    std::isfinite(p.loss) && p.loss > 0});
  *ok = true;
  for (const auto& [what, good] : checks) {
    absl::StrAppend(&out, "- ", good ? "yes" : "NO ", ": ", what, "\n");
    *ok = *ok && good;
  }
  return out;
}

}  // namespace summa::bench
