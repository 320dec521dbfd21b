#include "worker/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "client/lease_keeper.h"
#include "client/ps_client.h"

namespace summa::worker {
namespace {

// The smallest power of two >= world: the examples one step pushes in all.
int64_t ExamplesPerStep(int world) {
  int64_t p = 1;
  while (p < world) p *= 2;
  return p;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

absl::Status BadResult(absl::string_view line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad synthetic_result line (", why, "): '", line, "'"));
}

}  // namespace

absl::Status ValidateSyntheticOptions(const SyntheticOptions& o) {
  if (o.model_bytes <= 0 || o.model_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--synthetic: the model needs a positive whole number of float32 parameters (a multiple "
        "of 4 bytes), got ", o.model_bytes, " bytes"));
  }
  const int64_t pages = ::sysconf(_SC_PHYS_PAGES);
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && o.model_bytes / page > pages / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--synthetic=", FormatByteSize(o.model_bytes), ": a synthetic worker holds two buffers of "
        "the model's size (weights and gradient) and this machine has ",
        absl::StrFormat("%.1f GiB", static_cast<double>(pages) * page / (1 << 30)), " of memory"));
  }
  if (o.steps < 1) return absl::InvalidArgumentError(absl::StrCat("--steps must be at least 1, got ", o.steps));
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size must be at least 1, got ", o.world_size));
  }
  if (o.rank < -1 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", o.rank, " is outside 0..", o.world_size - 1, " (or -1: assigned)"));
  }
  if (o.channels < 1 || o.channels > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--channels must be in [1, 64], got ", o.channels));
  }
  return absl::OkStatus();
}

std::vector<TensorSpec> SyntheticSpecs(int64_t model_bytes) {
  std::vector<TensorSpec> specs;
  const int64_t floats = model_bytes / 4;
  for (int64_t begin = 0, i = 0; begin < floats; begin += kSyntheticTensorFloats, ++i) {
    specs.push_back({absl::StrCat("synthetic.", i), DType::kFloat32,
                     {std::min(kSyntheticTensorFloats, floats - begin)}});
  }
  return specs;
}

float SyntheticInitialValue(int64_t i) { return static_cast<float>(i % 251) / 16.0f; }

int64_t SyntheticExamples(int rank, int world) {
  return rank == 0 ? ExamplesPerStep(world) - (world - 1) : 1;
}

double SyntheticShift(int world, int64_t steps, double lr) {
  const double summed = 0.5 * world * (world + 1.0);
  return static_cast<double>(steps) * lr * summed / static_cast<double>(ExamplesPerStep(world));
}

std::string FormatSyntheticStep(int rank, int64_t step, double us) {
  return absl::StrFormat("synthetic_step rank=%d step=%d us=%.1f", rank, step, us);
}

std::string FormatSyntheticResult(const SyntheticResult& r) {
  return absl::StrCat(
      "synthetic_result rank=", r.rank, " world=", r.world, " params=", r.params, " steps=", r.steps,
      absl::StrFormat(" median_step_us=%.1f", r.median_step_us),
      " push_bytes_per_step=", r.push_bytes_per_step, " pull_bytes_per_step=", r.pull_bytes_per_step,
      // %.9g: a float printed so that parsing it gives back the same float.
      absl::StrFormat(" first_weight=%.9g", r.first_weight), " uniform=", r.uniform ? "yes" : "no",
      " step_us=",
      absl::StrJoin(r.step_us, ",", [](std::string* out, double t) { absl::StrAppendFormat(out, "%.1f", t); }));
}

absl::StatusOr<SyntheticResult> ParseSyntheticResult(absl::string_view output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "synthetic_result ")) continue;
    SyntheticResult r;
    int found = 0;
    for (absl::string_view field : absl::StrSplit(rest, ' ', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      bool ok = true;
      if (kv.first == "rank") {
        ok = absl::SimpleAtoi(kv.second, &r.rank);
      } else if (kv.first == "world") {
        ok = absl::SimpleAtoi(kv.second, &r.world);
      } else if (kv.first == "params") {
        ok = absl::SimpleAtoi(kv.second, &r.params);
      } else if (kv.first == "steps") {
        ok = absl::SimpleAtoi(kv.second, &r.steps);
      } else if (kv.first == "median_step_us") {
        ok = absl::SimpleAtod(kv.second, &r.median_step_us);
      } else if (kv.first == "push_bytes_per_step") {
        ok = absl::SimpleAtoi(kv.second, &r.push_bytes_per_step);
      } else if (kv.first == "pull_bytes_per_step") {
        ok = absl::SimpleAtoi(kv.second, &r.pull_bytes_per_step);
      } else if (kv.first == "first_weight") {
        ok = absl::SimpleAtof(kv.second, &r.first_weight);
      } else if (kv.first == "uniform") {
        ok = kv.second == "yes" || kv.second == "no";
        r.uniform = kv.second == "yes";
      } else if (kv.first == "step_us") {
        for (absl::string_view t : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
          double us = 0;
          ok = ok && absl::SimpleAtod(t, &us);
          r.step_us.push_back(us);
        }
      } else {
        continue;  // a field a later version added
      }
      if (!ok) return BadResult(line, absl::StrCat(kv.first, " is not a value"));
      ++found;
    }
    if (found < 10) return BadResult(line, "needs rank, world, params, steps, median_step_us, "
                                           "push_bytes_per_step, pull_bytes_per_step, first_weight, "
                                           "uniform and step_us");
    if (static_cast<int64_t>(r.step_us.size()) != r.steps) {
      return BadResult(line, absl::StrCat(r.steps, " steps but ", r.step_us.size(), " step times"));
    }
    return r;
  }
  return absl::NotFoundError("no synthetic_result line");
}

absl::StatusOr<SyntheticResult> RunSynthetic(const SyntheticOptions& options, ParameterStore* store,
                                             std::FILE* out) {
  SUMMA_RETURN_IF_ERROR(ValidateSyntheticOptions(options));
  const std::vector<TensorSpec> specs = SyntheticSpecs(options.model_bytes);
  const int64_t params = options.model_bytes / 4;
  // Both buffers once, for every step.
  std::unique_ptr<float[]> weights(new float[params]);
  std::unique_ptr<float[]> gradient(new float[params]);
  for (int64_t i = 0; i < params; ++i) weights[i] = SyntheticInitialValue(i);
  // Only the worker that may define the model sends the values (as the trainer does): the others
  // wait in Join until they are there, so the server is not sent N copies at once.
  SUMMA_ASSIGN_OR_RETURN(const JoinInfo joined,
                         store->Join(options.rank, options.world_size, specs,
                                     options.rank <= 0 ? weights.get() : nullptr, ""));
  const int rank = joined.rank;
  if (joined.next_step != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server's job is already at step ", joined.next_step,
        "; a synthetic run starts from a fresh server (its result is known only from step 0)"));
  }
  LeaseKeeper leases(store);
  leases.Start(rank, joined.lease);
  SUMMA_RETURN_IF_ERROR(store->PullAll(joined.version, weights.get()).status());
  // On the shared-memory plane the gradient lives where the server sums it: pushes copy nothing.
  SUMMA_ASSIGN_OR_RETURN(float* const shared, store->SharedValues(static_cast<size_t>(params)));
  float* const pushed = shared != nullptr ? shared : gradient.get();
  std::fill(pushed, pushed + params, static_cast<float>(rank + 1));
  const int64_t examples = SyntheticExamples(rank, options.world_size);

  SyntheticResult result;
  result.rank = rank;
  result.world = options.world_size;
  result.params = params;
  result.steps = options.steps;
  result.push_bytes_per_step = params * 4;
  result.pull_bytes_per_step = params * 4;
  std::vector<int> live;
  for (int64_t step = 0; step < options.steps; ++step) {
    const absl::Time start = absl::Now();
    SUMMA_RETURN_IF_ERROR(store->PushPull(step, examples, pushed, weights.get(), &live).status());
    const double us = absl::ToDoubleMicroseconds(absl::Now() - start);
    result.step_us.push_back(us);
    std::fprintf(out, "%s\n", FormatSyntheticStep(rank, step, us).c_str());
    std::fflush(out);
  }
  leases.Stop();
  store->Leave(rank).IgnoreError();  // the job is over for this worker either way

  result.median_step_us =
      Median(result.step_us.size() > 1 ? std::vector<double>(result.step_us.begin() + 1, result.step_us.end())
                                       : result.step_us);
  result.first_weight = weights[0];
  const float shift = weights[0] - SyntheticInitialValue(0);
  result.uniform = true;
  for (int64_t i = 1; i < params && result.uniform; ++i) {
    result.uniform = weights[i] - SyntheticInitialValue(i) == shift;
  }
  return result;
}

absl::Status RunSyntheticWorker(const SyntheticOptions& options) {
  SUMMA_RETURN_IF_ERROR(ValidateSyntheticOptions(options));
  SUMMA_LOG(INFO) << "synthetic worker (rank " << options.rank << " of " << options.world_size
                  << "): a model of " << FormatByteSize(options.model_bytes) << ", " << options.steps
                  << " steps, server " << options.server;
  ParameterClient client(options.server, options.call_deadline, options.join_deadline, options.channels);
  client.set_data_plane(options.data_plane);
  SUMMA_ASSIGN_OR_RETURN(const SyntheticResult result, RunSynthetic(options, &client, stdout));
  std::printf("%s\n", FormatSyntheticResult(result).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace summa::worker
