#include "bench/pipeline_profile.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/compute/backend.h"
#include "worker/models/lenet.h"
#include "worker/models/pipeline.h"

namespace summa::bench {
namespace {

using worker::LeNet;
using worker::Model;

struct Batch {
  std::vector<float> images, labels;
};

Batch RandomBatch(int n) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> pixel(0, 1);
  Batch b;
  b.images.resize(int64_t{n} * LeNet::kImageFloats);
  for (float& p : b.images) p = pixel(rng);
  for (int i = 0; i < n; ++i) b.labels.push_back(static_cast<float>(rng() % LeNet::kClasses));
  return b;
}

// Mean wall time of a step (weights in, gradients, gradients out) after the warm-up; the last
// step's gradient in `gradient`.
absl::StatusOr<double> TimeSteps(Model& model, const PipelineProfileOptions& o, const Batch& b,
                                 const std::vector<float>& w, std::vector<float>* gradient,
                                 const std::function<void()>& after_warmup) {
  gradient->resize(model.num_params());
  absl::Time start;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) {
      after_warmup();
      start = absl::Now();
    }
    SUMMA_RETURN_IF_ERROR(model.SetWeights(w.data()));
    SUMMA_RETURN_IF_ERROR(model.ComputeGradients(worker::Examples::Host(b.images.data(), b.labels.data()), o.batch));
    SUMMA_RETURN_IF_ERROR(model.TakeLoss().status());
    SUMMA_RETURN_IF_ERROR(model.GetGradients(gradient->data()));
  }
  return absl::ToDoubleMilliseconds(absl::Now() - start) / o.steps;
}

}  // namespace

absl::Status ValidatePipelineProfileOptions(const PipelineProfileOptions& o) {
  if (o.batch < 1) return absl::InvalidArgumentError("--batch must be at least 1");
  if (o.steps < 1 || o.warmup < 0) return absl::InvalidArgumentError("--steps must be at least 1, --warmup at least 0");
  if (o.micro_batches.empty()) return absl::InvalidArgumentError("--micro_batches names no count");
  for (int m : o.micro_batches) {
    if (m < 1) return absl::InvalidArgumentError(absl::StrCat("--micro_batches: ", m, " is below 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PipelineProfile> ProfilePipeline(const PipelineProfileOptions& o) {
  SUMMA_RETURN_IF_ERROR(ValidatePipelineProfileOptions(o));
  const Batch batch = RandomBatch(o.batch);
  const std::vector<float> w = LeNet::SeedWeights(1);
  PipelineProfile p;
  std::vector<float> reference;
  {
    std::unique_ptr<worker::Backend> one = worker::NewCpuBackend(1);
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<LeNet> net, LeNet::Create(one.get(), o.batch, one->preferred_chunk()));
    SUMMA_ASSIGN_OR_RETURN(p.one_device_ms, TimeSteps(*net, o, batch, w, &reference, [] {}));
  }
  float largest = 0;
  for (float g : reference) largest = std::max(largest, std::abs(g));
  for (int m : o.micro_batches) {
    std::unique_ptr<worker::Backend> first = worker::NewCpuBackend(1), second = worker::NewCpuBackend(1);
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<worker::PipelinedLeNet> split,
                           worker::PipelinedLeNet::Create(first.get(), second.get(), o.batch, m));
    std::vector<float> gradient;
    PipelineRow row;
    row.micro_batches = m;
    SUMMA_ASSIGN_OR_RETURN(row.step_ms, TimeSteps(*split, o, batch, w, &gradient, [&] { split->ResetTiming(); }));
    for (int s = 0; s < 2; ++s) row.stage_ms[s] = absl::ToDoubleMilliseconds(split->timing().stage[s]) / o.steps;
    for (size_t i = 0; i < gradient.size(); ++i) {
      row.max_error = std::max(row.max_error, static_cast<double>(std::abs(gradient[i] - reference[i])) / largest);
    }
    p.rows.push_back(row);
  }
  return p;
}

std::string FormatPipelineProfile(const PipelineProfileOptions& o, const PipelineProfile& p, bool* ok) {
  std::string out = absl::StrCat("Command: ", o.command_line, "\n\nLeNet, batch ", o.batch, ", ", o.steps,
                                 " timed steps after ", o.warmup, "; two CPU backends of one OpenBLAS thread each "
                                 "(stage 0: the convolutions; stage 1: the dense layers); one device, the whole "
                                 "model at the CPU backend's chunk: ",
                                 absl::StrFormat("%.2f", p.one_device_ms), " ms a step\n\n");
  absl::StrAppend(&out, "| micro-batches | step (ms) | stage 0 busy (ms) | stage 1 busy (ms) | sum of the stages (ms) "
                        "| sum / step | bubble | vs one device | gradient's largest error |\n");
  absl::StrAppend(&out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  *ok = true;
  for (const PipelineRow& r : p.rows) {
    const double sum = r.stage_ms[0] + r.stage_ms[1];
    const bool close = r.max_error <= 1e-5;
    *ok = *ok && close;
    absl::StrAppend(&out, absl::StrFormat("| %d | %.2f | %.2f | %.2f | %.2f | %.2fx | %.0f%% | %.2fx | %.1e%s |\n",
                                          r.micro_batches, r.step_ms, r.stage_ms[0], r.stage_ms[1], sum,
                                          sum / r.step_ms, 100 * (1 - sum / (2 * r.step_ms)),
                                          p.one_device_ms / r.step_ms, r.max_error, close ? "" : " (over 1e-5)"));
  }
  absl::StrAppend(&out, "\n- ", *ok ? "yes" : "NO",
                  ": every split run's gradient equals the one-device gradient to 1e-5 of its largest value\n");
  return out;
}

}  // namespace summa::bench
