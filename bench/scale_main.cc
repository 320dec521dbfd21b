// summa-bench-scale: parses flags and runs the scaling benchmark's driver (bench/scale_driver.h).
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/child_process.h"
#include "bench/invocation.h"
#include "bench/scale_driver.h"
#include "common/allocator.h"
#include "common/byte_size.h"
#include "common/flags.h"

ABSL_FLAG(std::string, workers, "1,2,4,8,16,32",
          "worker counts, comma-separated, run in this order; each gets a fresh summa-server");
ABSL_FLAG(std::string, model_bytes, "64MiB",
          "the model's size (K, M, G and KiB, MiB, GiB all count in 1024s); a multiple of 4 bytes "
          "(float32 parameters)");
ABSL_FLAG(int64_t, steps, 20,
          "synchronous steps per configuration, at least 3 (step 0 is not timed: it also waits for "
          "every worker to join; the server is measured from the end of step 0 to the end of step "
          "S-2)");
ABSL_FLAG(std::string, shards, "1",
          "comma-separated shard counts k: each runs every worker count on k summa-server shards "
          "(--shards=k --shard=i); the model needs at least k partitions of --partition_bytes");
ABSL_FLAG(double, lr, 1.0 / 1024,
          "the server's SGD learning rate; a power of two, so that the final weight has an exact "
          "expected value");
ABSL_FLAG(std::string, partition_bytes, "4MiB", "the server's --partition_bytes");
ABSL_FLAG(bool, deterministic, false,
          "run the server with --deterministic (each step's pushes kept and summed in rank order): "
          "its cost in step time, server CPU and RSS against the default sum-on-arrival");
ABSL_FLAG(std::string, data_plane, "socket",
          "the workers' transport for the data path: socket (the servers' socket data plane, "
          "summa-server --data_address), shm (the shared-memory plane, summa-server --shm_socket) or grpc");
ABSL_FLAG(double, reference_gbps, 0,
          "also show the PS model at this bandwidth B (GB/s each way), e.g. the raw-TCP exchange's "
          "from bench/results-allreduce.md; 0: only the B fitted to the 1-worker row");
ABSL_FLAG(std::string, reference_source, "reference",
          "where --reference_gbps comes from, as the report and the plot name it");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(20),
          "deadline of each configuration (server start, joins, every step); a child that has not "
          "finished by then is named and killed, and the configuration is a FAILED row. Also the "
          "server's --barrier_deadline and the workers' call and join deadlines");
ABSL_FLAG(std::string, server, "",
          "the summa-server binary; default: ../server/summa-server next to this binary's directory "
          "(the build tree's layout)");
ABSL_FLAG(std::string, worker, "",
          "the summa-worker binary; default: ../worker/summa-worker next to this binary's directory");
ABSL_FLAG(std::string, plot, "",
          "write a PNG of step time against workers, next to the PS model, here (needs --python "
          "with matplotlib: apt-get install python3-matplotlib); empty: no plot");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "the Python that runs --plot_script");
ABSL_FLAG(std::string, plot_script, SUMMA_SOURCE_DIR "/bench/scale_plot.py", "the plot script");
ABSL_FLAG(std::string, out, "", "also write the report (command, environment, table) to this file");
ABSL_FLAG(bool, check, false,
          "exit with status 1 unless every row ran and is correct (for tests; no timing is checked)");

namespace {

constexpr char kUsage[] =
    "the parameter server's scaling benchmark. For each shard count k and worker count N it starts "
    "k summa-server shards and N synthetic workers (summa-worker --synthetic: they push a gradient and pull the weights "
    "of a model of --model_bytes each step, computing nothing) on 127.0.0.1, and prints a markdown "
    "table: step time (median over steps of the slowest worker) next to the parameter-server model "
    "max(M/B, N*M/(k*B)), bytes and CPU seconds per step through a shard, the largest peak RSS, and "
    "whether every worker's final weights are exactly right.\n\n"
    "  summa-bench-scale --workers=1,2,4,8,16,32 --shards=1,2 --model_bytes=64MiB --steps=20 "
    "--out=bench/results-scale.md --plot=bench/scale.png";

int FlagError(const std::string& message) {
  std::fprintf(stderr, "summa-bench-scale: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  summa::KeepFreedMemoryForReuse();
  summa::ParseFlagsOrDie(argc, argv, kUsage);
  summa::bench::ScaleOptions o;
  for (absl::string_view n : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    int workers = 0;
    if (!absl::SimpleAtoi(n, &workers)) return FlagError(absl::StrCat("--workers: '", n, "' is not a number"));
    o.workers.push_back(workers);
  }
  absl::StatusOr<int64_t> model_bytes = summa::ParseByteSize(absl::GetFlag(FLAGS_model_bytes));
  if (!model_bytes.ok()) return FlagError(absl::StrCat("--model_bytes: ", model_bytes.status().message()));
  o.model_bytes = *model_bytes;
  absl::StatusOr<int64_t> partition_bytes = summa::ParseByteSize(absl::GetFlag(FLAGS_partition_bytes));
  if (!partition_bytes.ok()) {
    return FlagError(absl::StrCat("--partition_bytes: ", partition_bytes.status().message()));
  }
  o.partition_bytes = *partition_bytes;
  o.deterministic = absl::GetFlag(FLAGS_deterministic);
  o.data_plane = absl::GetFlag(FLAGS_data_plane);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.shards.clear();
  for (absl::string_view k : absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty())) {
    int shards = 0;
    if (!absl::SimpleAtoi(k, &shards)) return FlagError(absl::StrCat("--shards: '", k, "' is not a number"));
    o.shards.push_back(shards);
  }
  o.lr = absl::GetFlag(FLAGS_lr);
  o.reference_gbps = absl::GetFlag(FLAGS_reference_gbps);
  o.reference_source = absl::GetFlag(FLAGS_reference_source);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  const std::filesystem::path build = std::filesystem::path(summa::bench::SelfPath()).parent_path().parent_path();
  o.server = absl::GetFlag(FLAGS_server);
  if (o.server.empty()) o.server = (build / "server" / "summa-server").string();
  o.worker = absl::GetFlag(FLAGS_worker);
  if (o.worker.empty()) o.worker = (build / "worker" / "summa-worker").string();
  o.plot_path = absl::GetFlag(FLAGS_plot);
  o.python = absl::GetFlag(FLAGS_python);
  o.plot_script = absl::GetFlag(FLAGS_plot_script);
  o.out_path = absl::GetFlag(FLAGS_out);
  o.command_line = summa::bench::CommandLine(argc, argv);

  absl::Status valid = summa::bench::ValidateScaleOptions(o);
  if (!valid.ok()) return FlagError(std::string(valid.message()));
  absl::StatusOr<bool> all_correct = summa::bench::RunScaleBenchmark(o);
  if (absl::IsCancelled(all_correct.status())) {
    std::fprintf(stderr, "summa-bench-scale: %s; every child process was killed\n",
                 std::string(all_correct.status().message()).c_str());
    return 128 + summa::bench::StopSignal();
  }
  if (!all_correct.ok()) {
    std::fprintf(stderr, "summa-bench-scale: %s\n", all_correct.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_check) && !*all_correct) {
    std::fprintf(stderr, "summa-bench-scale: --check: not every row ran and is correct\n");
    return 1;
  }
  return 0;
}
