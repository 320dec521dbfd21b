#include "bench/scale_driver.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "bench/invocation.h"
#include "bench/scale_report.h"
#include "common/byte_size.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "summa/v1/summa.grpc.pb.h"
#include "worker/synthetic.h"

namespace summa::bench {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kStopGrace = absl::Seconds(10);
constexpr absl::Duration kPlotTimeout = absl::Minutes(2);

// What the server has done up to one moment: its CPU time and its own counters; and the CPU time
// of every worker.
struct ServerSample {
  double cpu_seconds = 0;
  std::optional<double> workers_cpu_seconds;  // unknown once a worker has exited
  uint64_t bytes_in = 0;   // gradient bytes received (pushes)
  uint64_t bytes_out = 0;  // weight bytes sent (pulls)
  uint64_t version = 0;    // steps completed
};

absl::StatusOr<ServerSample> SampleServer(pid_t pid, const std::string& address,
                                          const std::vector<std::unique_ptr<ChildProcess>>& workers) {
  ServerSample sample;
  SUMMA_ASSIGN_OR_RETURN(sample.cpu_seconds, CpuSeconds(pid));
  sample.workers_cpu_seconds = 0;
  for (const auto& w : workers) {
    absl::StatusOr<double> seconds = CpuSeconds(w->pid());
    if (!seconds.ok()) {
      sample.workers_cpu_seconds.reset();
      break;
    }
    *sample.workers_cpu_seconds += *seconds;
  }
  auto stub = summa::v1::ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  summa::v1::ServerStatus status;
  grpc::Status s = stub->GetStatus(&context, summa::v1::GetStatusRequest(), &status);
  if (!s.ok()) {
    absl::Status st = FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat("GetStatus of the server at ", address, ": ", st.message()));
  }
  sample.bytes_in = status.bytes_in();
  sample.bytes_out = status.bytes_out();
  sample.version = status.version();
  return sample;
}

double Mib(double bytes) { return bytes / (1 << 20); }

class Benchmark {
 public:
  Benchmark(const ScaleOptions& options, std::string run_dir) : o_(options), run_dir_(std::move(run_dir)) {}

  absl::StatusOr<bool> Run();
  bool keep_run_dir() const { return !failures_.empty(); }

 private:
  // One configuration: k fresh server shards, N workers, the samples, the checks.
  absl::StatusOr<ScaleRow> RunConfig(int shards, int workers);
  // Writes the plot through the Python script; the error says why it could not.
  absl::Status Plot(const std::vector<ScaleRow>& rows);
  void Emit(const std::string& line);
  ScaleRow FailedRow(int shards, int workers, const absl::Status& error);
  std::string RunPath(const std::string& name) const { return absl::StrCat(run_dir_, "/", name); }

  const ScaleOptions& o_;
  const std::string run_dir_;
  std::string report_;
  std::vector<std::string> failures_;  // "[k] N workers: what went wrong"
};

void Benchmark::Emit(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  absl::StrAppend(&report_, line, "\n");
}

ScaleRow Benchmark::FailedRow(int shards, int workers, const absl::Status& error) {
  ScaleRow row;
  row.workers = workers;
  row.shards = shards;
  row.model_bytes = o_.model_bytes;
  row.note = absl::StrCat("FAILED [", failures_.size() + 1, "]");
  std::string why = error.ToString();
  if (absl::IsDeadlineExceeded(error)) absl::StrAppend(&why, " (--timeout=", absl::FormatDuration(o_.timeout), ")");
  failures_.push_back(absl::StrCat("[", failures_.size() + 1, "] ", workers, " workers, k = ", shards, ": ", why));
  std::fprintf(stderr, "%s\n", failures_.back().c_str());
  return row;
}

absl::StatusOr<ScaleRow> Benchmark::RunConfig(int shards, int workers) {
  const absl::Time deadline = absl::Now() + o_.timeout;
  const double load_average = LoadAverage();
  SUMMA_ASSIGN_OR_RETURN(const float expected, ExpectedFirstWeight(workers, o_.steps, o_.lr));
  const std::string tag = absl::StrCat("k", shards, "n", workers);
  const std::string timeout = absl::FormatDuration(o_.timeout);
  std::vector<std::unique_ptr<ChildProcess>> server_processes;
  std::vector<std::string> addresses;
  for (int i = 0; i < shards; ++i) {
    const std::string port_file = RunPath(absl::StrCat(tag, "-shard", i, ".port"));
    ChildOptions server;
    server.name = shards == 1 ? "summa-server" : absl::StrCat("summa-server shard ", i);
    server.log_path = RunPath(absl::StrCat(tag, "-shard", i, ".log"));
    server.argv = {o_.server, "--address=127.0.0.1:0", "--data_address=127.0.0.1:0",
                   absl::StrCat("--port_file=", port_file),
                   absl::StrCat("--workers=", workers), absl::StrFormat("--lr=%.17g", o_.lr),
                   absl::StrCat("--partition_bytes=", o_.partition_bytes),
                   absl::StrCat("--barrier_deadline=", timeout), absl::StrCat("--shards=", shards),
                   absl::StrCat("--shard=", i)};
    if (o_.deterministic) server.argv.push_back("--deterministic");
    if (o_.data_plane == "shm") server.argv.push_back("--shm_socket=" + RunPath(absl::StrCat(tag, "-shard", i, ".sock")));
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> process, ChildProcess::Start(server));
    SUMMA_ASSIGN_OR_RETURN(const std::string port, WaitForFile(port_file, *process, deadline));
    addresses.push_back("127.0.0.1:" + port);
    server_processes.push_back(std::move(process));
  }
  const std::string address = absl::StrJoin(addresses, ",");

  std::vector<ChildOptions> worker_options(workers);
  for (int r = 0; r < workers; ++r) {
    ChildOptions& w = worker_options[r];
    w.name = absl::StrCat("synthetic worker ", r);
    w.log_path = RunPath(absl::StrCat(tag, "-worker", r, ".log"));
    w.capture_stdout = true;
    w.argv = {o_.worker, "--server=" + address, absl::StrCat("--rank=", r),
              absl::StrCat("--world_size=", workers), absl::StrCat("--synthetic=", o_.model_bytes),
              absl::StrCat("--steps=", o_.steps), "--call_deadline=" + timeout, "--join_deadline=" + timeout,
              "--data_plane=" + o_.data_plane};
  }
  SUMMA_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ChildProcess>> worker_processes, StartAll(worker_options));

  // The measured window runs from the moment every worker has finished step 0 (joins, initial
  // values and the first pull are behind it) to the moment every worker has finished step S-2:
  // S-2 steps. Both ends are seen the same way (the last worker's step line, read here a moment
  // after it is printed, while the next step has begun), so the bit of the next step each end
  // catches cancels out, which a window closed when the workers exit would not.
  const int64_t last = o_.steps - 2;
  std::optional<absl::StatusOr<ServerSample>> open, close;
  auto all_past = [](const std::vector<std::string>& outputs, int64_t step) {
    const std::string line = absl::StrCat(" step=", step, " us=");
    return std::all_of(outputs.begin(), outputs.end(),
                       [&](const std::string& out) { return absl::StrContains(out, line); });
  };
  // Every shard sampled (the workers' CPU with shard 0's sample): totals over the shards.
  auto sample = [&](const std::vector<std::unique_ptr<ChildProcess>>& with_workers) -> absl::StatusOr<ServerSample> {
    static const std::vector<std::unique_ptr<ChildProcess>> kNone;
    ServerSample total;
    total.version = UINT64_MAX;
    for (int i = 0; i < shards; ++i) {
      SUMMA_ASSIGN_OR_RETURN(const ServerSample one,
                             SampleServer(server_processes[i]->pid(), addresses[i], i == 0 ? with_workers : kNone));
      total.cpu_seconds += one.cpu_seconds;
      if (i == 0) total.workers_cpu_seconds = one.workers_cpu_seconds;
      total.bytes_in += one.bytes_in;
      total.bytes_out += one.bytes_out;
      total.version = std::min(total.version, one.version);
    }
    return total;
  };
  auto on_output = [&](const std::vector<std::string>& outputs) {
    if (!open && all_past(outputs, 0)) open = sample(worker_processes);
    if (open && !close && all_past(outputs, last)) close = sample(worker_processes);
  };
  std::vector<std::string> outputs;
  SUMMA_RETURN_IF_ERROR(
      RunToCompletion(Pointers(worker_processes), Pointers(server_processes), deadline, &outputs, on_output));
  if (!open || !close) {
    return absl::DataLossError(absl::StrCat("the workers' step lines never showed every worker past steps 0 and ", last));
  }
  SUMMA_RETURN_IF_ERROR(open->status());
  SUMMA_RETURN_IF_ERROR(close->status());
  SUMMA_ASSIGN_OR_RETURN(const ServerSample end, sample({}));
  int64_t peak_rss = 0;
  for (const auto& process : server_processes) {
    SUMMA_ASSIGN_OR_RETURN(const int64_t rss, PeakRssBytes(process->pid()));
    peak_rss = std::max(peak_rss, rss);
  }
  for (const auto& process : server_processes) SUMMA_RETURN_IF_ERROR(process->Stop(kStopGrace));

  std::vector<worker::SyntheticResult> results;
  for (int r = 0; r < workers; ++r) {
    absl::StatusOr<worker::SyntheticResult> result = worker::ParseSyntheticResult(outputs[r]);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat(worker_processes[r]->Describe(), ": ", result.status().message()));
    }
    results.push_back(*std::move(result));
  }
  ScaleRow row;
  row.workers = workers;
  row.shards = shards;
  row.model_bytes = o_.model_bytes;
  SUMMA_ASSIGN_OR_RETURN(const double step_us, MedianSlowestStepUs(results));
  row.step_ms = step_us / 1e3;
  // Per shard: the totals over the shards, divided by k.
  const double window_steps = static_cast<double>(last) * shards;
  const ServerSample& from = **open;
  const ServerSample& to = **close;
  row.server_in_mib = Mib(static_cast<double>(to.bytes_in - from.bytes_in) / window_steps);
  row.server_out_mib = Mib(static_cast<double>(to.bytes_out - from.bytes_out) / window_steps);
  row.server_cpu_s = (to.cpu_seconds - from.cpu_seconds) / window_steps;
  if (from.workers_cpu_seconds && to.workers_cpu_seconds) {
    row.workers_cpu_s = (*to.workers_cpu_seconds - *from.workers_cpu_seconds) / static_cast<double>(last);
  }
  row.load_average = load_average;
  row.server_peak_rss_mib = Mib(static_cast<double>(peak_rss));
  row.correct = true;
  std::string wrong;
  if (end.version != static_cast<uint64_t>(o_.steps)) {
    wrong = absl::StrCat("the server ended at version ", end.version, ", not ", o_.steps);
  }
  for (int r = 0; r < workers && wrong.empty(); ++r) {
    wrong = CheckSyntheticResult(results[r], r, workers, o_.steps, o_.model_bytes, expected);
  }
  if (!wrong.empty()) {
    row.correct = false;
    row.note = absl::StrCat("no [", failures_.size() + 1, "]");
    failures_.push_back(absl::StrCat("[", failures_.size() + 1, "] ", workers, " workers, k = ", shards, ": ", wrong));
    std::fprintf(stderr, "%s\n", failures_.back().c_str());
  }
  return row;
}

absl::Status Benchmark::Plot(const std::vector<ScaleRow>& rows) {
  const std::string data = RunPath("scale.tsv");
  {
    std::ofstream out(data, std::ios::trunc);
    out << PlotData(rows);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", data));
  }
  ChildOptions plot;
  plot.name = "scale_plot.py";
  plot.log_path = RunPath("plot.log");
  plot.argv = {o_.python, o_.plot_script, "--data=" + data, "--out=" + o_.plot_path,
               absl::StrCat("--title=summa-server, model ", FormatByteSize(o_.model_bytes), ", ", o_.steps,
                            " steps, k = ", absl::StrJoin(o_.shards, ", "))};
  if (o_.reference_gbps > 0) {
    plot.argv.push_back(absl::StrFormat("--reference_label=%.3f GB/s (%s)", o_.reference_gbps, o_.reference_source));
  }
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> process, ChildProcess::Start(plot));
  std::vector<std::string> ignored;
  ChildProcess* const children[] = {process.get()};
  return RunToCompletion(children, {}, absl::Now() + kPlotTimeout, &ignored);
}

absl::StatusOr<bool> Benchmark::Run() {
  const std::string environment = DescribeEnvironment();
  std::vector<ScaleRow> rows;
  for (int shards : o_.shards) {
    for (int workers : o_.workers) {
      std::fprintf(stderr, "running %d synthetic worker%s on %d shard%s, model %s, %lld steps ...\n", workers,
                   workers == 1 ? "" : "s", shards, shards == 1 ? "" : "s", FormatByteSize(o_.model_bytes).c_str(),
                   static_cast<long long>(o_.steps));
      absl::StatusOr<ScaleRow> row = RunConfig(shards, workers);
      if (absl::IsCancelled(row.status())) return row.status();
      rows.push_back(row.ok() ? *row : FailedRow(shards, workers, row.status()));
    }
  }
  // The model's B from the 1-worker row, when there is one that ran.
  std::optional<double> fitted;
  for (const ScaleRow& r : rows) {
    if (r.workers == 1 && r.shards == 1 && r.step_ms) fitted = FitBandwidth(o_.model_bytes, *r.step_ms / 1e3);
  }
  const bool reference = o_.reference_gbps > 0;
  for (ScaleRow& r : rows) {
    if (fitted) r.model_ms = 1e3 * PsModelSeconds(o_.model_bytes, r.workers, r.shards, *fitted);
    if (reference) r.reference_ms = 1e3 * PsModelSeconds(o_.model_bytes, r.workers, r.shards, o_.reference_gbps * 1e9);
  }

  const std::string lr = absl::StrFormat("%.17g", o_.lr);
  Emit(absl::StrCat("Command: ", o_.command_line));
  Emit("");
  Emit(environment);
  Emit("");
  Emit(absl::StrCat(
      "Each configuration starts k summa-server shards (--shards=k --shard=i --workers=N --lr=", lr, " --partition_bytes=",
      o_.partition_bytes, o_.deterministic ? " --deterministic" : "", " --data_address=127.0.0.1:0) and N synthetic "
      "workers (summa-worker --synthetic=", FormatByteSize(o_.model_bytes), " --steps=", o_.steps, " --data_plane=",
      o_.data_plane, ") on 127.0.0.1: per step each worker "
      "push-pulls the whole model (M bytes up, M down) and computes nothing. step time = the median "
      "over steps 1..", o_.steps - 1, " of the slowest worker's PushPull wall time (step 0 also "
      "waits for every worker to join). server in/out and CPU per step, per shard: the shards' gradient and "
      "weight byte counters (GetStatus) and their utime+stime (/proc/PID/stat), summed and divided by k, "
      "and the workers' utime+stime summed, from the moment "
      "every worker has finished step 0 to the moment every worker has finished step ", o_.steps - 2,
      ", divided by ", o_.steps - 2, " (both ends are seen through the workers' step lines, a "
      "few ms late: meaningful for steps well above that). server peak RSS = "
      "the largest shard's VmHWM, read before the shards are stopped. load avg = the machine's 1-minute load average as "
      "the configuration began (the benchmark shares the machine). correct = every worker's first weight equals the "
      "exact w0 - S*lr*N(N+1)/2/P (P = the power of two >= N of examples per step), every other "
      "weight moved by as much, and the server ended at version S."));
  Emit("");
  std::string model = absl::StrCat(
      "PS model: max(M/B, N*M/(k*B)) (BytePS, OSDI 2020: full-duplex links of B bytes/s each way). ");
  if (fitted) {
    absl::StrAppend(&model, absl::StrFormat(
        "B fitted to the 1-worker, 1-shard row: B = M/t1 = %.3f GB/s each way (%.3f GB/s counting both "
        "directions; either reading predicts t_N = max(1, N/k) x t1).", *fitted / 1e9, 2 * *fitted / 1e9));
  } else {
    absl::StrAppend(&model, "No 1-worker, 1-shard row ran, so no B was fitted.");
  }
  if (reference) {
    absl::StrAppend(&model, absl::StrFormat(" Reference: B = %.3f GB/s each way (%s).", o_.reference_gbps,
                                            o_.reference_source));
  }
  Emit(model);
  Emit("");
  Emit(ScaleTableHeader(reference));
  bool all_correct = true;
  for (const ScaleRow& r : rows) {
    all_correct = all_correct && r.correct;
    Emit(FormatScaleRow(r, reference));
  }
  if (!failures_.empty()) {
    Emit("");
    for (const std::string& f : failures_) Emit(absl::StrCat("    ", absl::StrReplaceAll(f, {{"\n", "\n    "}})));
  }
  if (!o_.out_path.empty()) {
    std::ofstream out(o_.out_path, std::ios::trunc);
    out << report_;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", o_.out_path));
  }
  if (!o_.plot_path.empty()) {
    absl::Status plotted = Plot(rows);
    if (absl::IsCancelled(plotted)) return plotted;
    if (!plotted.ok()) {
      failures_.push_back("plot");  // keeps the run directory, with plot.log
      return absl::Status(plotted.code(), absl::StrCat("the plot was not written: ", plotted.message()));
    }
    std::fprintf(stderr, "plot written to %s\n", o_.plot_path.c_str());
  }
  return all_correct;
}

}  // namespace

absl::Status ValidateScaleOptions(const ScaleOptions& o) {
  if (o.data_plane != "socket" && o.data_plane != "grpc" && o.data_plane != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_plane must be socket, shm or grpc, not '", o.data_plane, "'"));
  }
  if (o.workers.empty()) return absl::InvalidArgumentError("--workers: name at least one worker count");
  for (int n : o.workers) {
    if (n < 1) return absl::InvalidArgumentError("--workers: every worker count must be at least 1");
  }
  if (o.shards.empty()) return absl::InvalidArgumentError("--shards: name at least one shard count");
  const int64_t partitions = o.partition_bytes > 0 ? (o.model_bytes + o.partition_bytes - 1) / o.partition_bytes : 0;
  for (int k : o.shards) {
    if (k < 1) return absl::InvalidArgumentError("--shards: every shard count must be at least 1");
    if (k > partitions) {
      return absl::InvalidArgumentError(absl::StrCat("--shards=", k, ": the model is ", partitions,
                                                     " partitions of --partition_bytes; each shard needs one"));
    }
  }
  if (o.model_bytes <= 0 || o.model_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model_bytes: ", o.model_bytes, " bytes is not a positive multiple of 4 (float32)"));
  }
  if (o.steps < 3) {
    return absl::InvalidArgumentError(
        "--steps must be at least 3 (step 0 is not timed: it also waits for every worker to join; "
        "the server is measured from the end of step 0 to the end of step S-2)");
  }
  if (o.partition_bytes < 4 || o.partition_bytes % 4 != 0) {
    return absl::InvalidArgumentError("--partition_bytes must be a positive multiple of 4");
  }
  if (o.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("--timeout must be positive");
  if (o.reference_gbps < 0) return absl::InvalidArgumentError("--reference_gbps must not be negative");
  for (int n : o.workers) {
    absl::Status exact = ExpectedFirstWeight(n, o.steps, o.lr).status();
    if (!exact.ok()) return absl::InvalidArgumentError(absl::StrCat("--lr/--steps/--workers: ", exact.message()));
  }
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--server", o.server},
                                   {"--worker", o.worker}}) {
    if (::access(path.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": no executable at ", path, " (build it, or pass ", flag, ")"));
    }
  }
  if (!o.plot_path.empty() && ::access(o.plot_script.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--plot_script: cannot read ", o.plot_script));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RunScaleBenchmark(const ScaleOptions& options) {
  SUMMA_RETURN_IF_ERROR(ValidateScaleOptions(options));
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/summa-bench-scale.XXXXXX");
  if (::mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory like ", dir_template));
  }
  InstallStopHandler();
  Benchmark benchmark(options, dir_template);
  absl::StatusOr<bool> result = benchmark.Run();
  // Logs of a failed configuration stay for a person to read; a clean run leaves nothing.
  if (benchmark.keep_run_dir() && !absl::IsCancelled(result.status())) {
    std::fprintf(stderr, "logs of every process are in %s\n", dir_template.c_str());
  } else {
    std::error_code ignored;
    fs::remove_all(dir_template, ignored);
  }
  return result;
}

}  // namespace summa::bench
