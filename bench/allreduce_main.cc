// summa-bench-allreduce: parses flags and runs the AllReduce benchmark's driver, or (started by
// the driver as a child) one of its roles: a Summa rank, a raw-TCP or bare-gRPC rank, or the raw
// TCP or bare gRPC server.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/allreduce_driver.h"
#include "bench/allreduce_rank.h"
#include "bench/allreduce_report.h"
#include "bench/child_process.h"
#include "bench/grpc_allreduce.h"
#include "bench/invocation.h"
#include "bench/raw_allreduce.h"
#include "common/allocator.h"
#include "common/byte_size.h"
#include "common/flags.h"

ABSL_FLAG(std::string, sizes, "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB,256MiB",
          "tensor sizes in bytes, comma-separated; K, KB and KiB all mean 1024 (likewise M, G); "
          "each a multiple of 4 (float32 elements)");
ABSL_FLAG(std::string, ranks, "2,4,8", "rank counts (processes taking part), comma-separated");
ABSL_FLAG(std::string, shards, "1",
          "summa: summa-server shard counts, comma-separated; on k shards the ranks list every shard "
          "and each tensor is cut into chunks dealt over them (at least one per shard where each is "
          "256KiB or more; worker::ParameterClient::PlanAllReduce). The other implementations have "
          "one server");
ABSL_FLAG(int, iters, 20, "timed AllReduce calls per configuration");
ABSL_FLAG(int, warmup, 10, "untimed AllReduce calls before the timed ones (still checked)");
ABSL_FLAG(std::string, impls, "summa,summa-grpc,raw,grpc,gloo,mpi",
          "implementations, comma-separated, run in this order: summa (summa-server's AllReduce "
          "through summa::worker::ParameterClient on the socket data plane, summa-server "
          "--data_address), summa-grpc (the same calls over gRPC, --data_plane=grpc), summa-shm (the "
          "same calls on the shared-memory plane, summa-server --shm_socket, --data_plane=shm), summa-tls and "
          "summa-tls-grpc (the two with mutual TLS 1.3 on both ports: summa-server --tls_cert "
          "--tls_key --tls_ca, certificates from scripts/make-certs.sh), raw (the same exchange over plain TCP "
          "sockets: the reference), grpc (the same exchange over bare gRPC: one generic method, "
          "the tensor as the whole message, an async server polled by one thread: what gRPC "
          "itself costs), gloo (torch.distributed with the gloo backend, through "
          "--python and --gloo_script), mpi (Open MPI's MPI_Allreduce through mpi4py, run by "
          "mpirun from PATH with --python and --mpi_script: two rows, over TCP on the loopback "
          "and over shared memory; a note where mpirun or mpi4py is missing), memcpy (one thread "
          "copying the tensor between two buffers: the host's copy rate, the physical limit; "
          "one row per size, ranks 1)");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(10),
          "deadline of each configuration (one size of one implementation at one rank count; a "
          "gloo job runs every size and gets this per size); a child that has not finished by "
          "then is named and killed, and the configuration is a FAILED row. Ranks and servers "
          "also use it to bound each call. Generous by default: 23 calls of 64MiB through "
          "summa-server take about two minutes on a 2-core machine");
ABSL_FLAG(std::string, server, "",
          "the summa-server binary; default: ../server/summa-server next to this binary's "
          "directory (the build tree's layout)");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "the Python that runs --gloo_script (needs torch) and --mpi_script (needs mpi4py)");
ABSL_FLAG(std::string, gloo_script, SUMMA_SOURCE_DIR "/bench/allreduce_gloo.py",
          "the gloo rank script");
ABSL_FLAG(std::string, mpi_script, SUMMA_SOURCE_DIR "/bench/allreduce_mpi.py", "the mpi rank script");
ABSL_FLAG(std::string, out, "", "also write the report (command, environment, table) to this file");
ABSL_FLAG(bool, check, false,
          "exit with status 1 unless every row ran and is correct (for tests; no timing is checked)");
ABSL_FLAG(std::string, role, "driver",
          "driver (the default: runs the matrix); the others are how the driver starts its "
          "children: summa_rank, raw_rank, grpc_rank, raw_server, grpc_server");
ABSL_FLAG(std::string, target, "",
          "summa_rank, raw_rank, grpc_rank: the server's host:port (summa_rank: every shard's, "
          "comma-separated, in shard order)");
ABSL_FLAG(int, rank, 0, "summa_rank, raw_rank, grpc_rank: this rank, in [0, group_size)");
ABSL_FLAG(int, group_size, 1, "summa_rank, raw_rank, grpc_rank, raw_server, grpc_server: ranks in the collective");
ABSL_FLAG(int64_t, bytes, 0, "summa_rank, raw_rank, grpc_rank, raw_server, grpc_server: the tensor size in bytes");
ABSL_FLAG(int, channels, 1,
          "summa: TCP connections each rank's client opens (chunks of a big tensor are spread over them)");
ABSL_FLAG(std::string, data_plane, "auto",
          "summa_rank: the client's transport, auto, grpc or socket (the driver sets it per row)");
ABSL_FLAG(int, server_pid, 0,
          "summa_rank, raw_rank, grpc_rank: count this server process's minor page faults over the timed calls "
          "(the driver sets it for rank 0)");
ABSL_FLAG(std::string, tls_cert, "", "summa_rank: the client's certificate, for mutual TLS (the summa-tls rows)");
ABSL_FLAG(std::string, tls_key, "", "summa_rank: the key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "summa_rank: the CA that signed the server's certificate; set: TLS");
ABSL_FLAG(std::string, port_file, "", "raw_server, grpc_server: write the port bound on 127.0.0.1 here");

namespace {

constexpr char kUsage[] =
    "an nccl-tests-style benchmark of summa.v1.ParameterServer/AllReduce. For each implementation, "
    "rank count and size it starts the processes needed on 127.0.0.1 (a fresh server per size), "
    "times every AllReduce at every rank, checks every element of every result, and prints a "
    "markdown table: time (median over iterations of the slowest rank), algbw, busbw, correct, "
    "server peak RSS.\n\n"
    "  summa-bench-allreduce --sizes=4KiB,1MiB,16MiB --ranks=2,4 --shards=1,2 --impls=summa,raw,gloo,mpi "
    "--out=bench/results-allreduce.md";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "summa-bench-allreduce: %s\n", status.ToString().c_str());
  return 1;
}

int FlagError(const std::string& message) {
  std::fprintf(stderr, "summa-bench-allreduce: %s\n", message.c_str());
  return 2;
}

summa::bench::RankOptions RankOptionsFromFlags() {
  summa::bench::RankOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.group_size = absl::GetFlag(FLAGS_group_size);
  o.bytes = absl::GetFlag(FLAGS_bytes);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.iters = absl::GetFlag(FLAGS_iters);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.channels = absl::GetFlag(FLAGS_channels);
  o.server_pid = absl::GetFlag(FLAGS_server_pid);
  o.data_plane = absl::GetFlag(FLAGS_data_plane);
  o.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
  return o;
}

int RunRankRole(const std::string& role) {
  const summa::bench::RankOptions o = RankOptionsFromFlags();
  if (o.bytes <= 0 || o.bytes % 4 != 0) return FlagError("--bytes must be a positive multiple of 4");
  absl::StatusOr<summa::bench::RankReport> report =
      role == "summa_rank" ? summa::bench::RunSummaRank(o)
      : role == "raw_rank" ? summa::bench::RunRawRank(o)
                           : summa::bench::RunGrpcRank(o);
  if (!report.ok()) return Fail(report.status());
  std::printf("%s\n", summa::bench::FormatRankReport(*report).c_str());
  return 0;
}

int RunDriver(int argc, char** argv) {
  summa::bench::DriverOptions o;
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    absl::StatusOr<int64_t> bytes = summa::ParseByteSize(size);
    if (!bytes.ok()) return FlagError(absl::StrCat("--sizes: ", bytes.status().message()));
    o.sizes.push_back(*bytes);
  }
  for (absl::string_view ranks : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(ranks, &n)) return FlagError(absl::StrCat("--ranks: '", ranks, "' is not a number"));
    o.ranks.push_back(n);
  }
  o.shards.clear();
  for (absl::string_view shards : absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty())) {
    int k = 0;
    if (!absl::SimpleAtoi(shards, &k)) return FlagError(absl::StrCat("--shards: '", shards, "' is not a number"));
    o.shards.push_back(k);
  }
  o.impls = absl::StrSplit(absl::GetFlag(FLAGS_impls), ',', absl::SkipEmpty());
  o.iters = absl::GetFlag(FLAGS_iters);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.channels = absl::GetFlag(FLAGS_channels);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.self = summa::bench::SelfPath();
  o.server = absl::GetFlag(FLAGS_server);
  if (o.server.empty()) {
    o.server = (std::filesystem::path(o.self).parent_path().parent_path() / "server" / "summa-server")
                   .string();
  }
  o.python = absl::GetFlag(FLAGS_python);
  o.gloo_script = absl::GetFlag(FLAGS_gloo_script);
  o.mpi_script = absl::GetFlag(FLAGS_mpi_script);
  o.make_certs = SUMMA_SOURCE_DIR "/scripts/make-certs.sh";
  o.mpirun = summa::bench::FindOnPath("mpirun");
  o.out_path = absl::GetFlag(FLAGS_out);
  o.command_line = summa::bench::CommandLine(argc, argv);

  absl::Status valid = summa::bench::ValidateDriverOptions(o);
  if (!valid.ok()) return FlagError(std::string(valid.message()));
  absl::StatusOr<bool> all_correct = summa::bench::RunAllReduceBenchmark(o);
  if (absl::IsCancelled(all_correct.status())) {
    std::fprintf(stderr, "summa-bench-allreduce: %s; every child process was killed\n",
                 std::string(all_correct.status().message()).c_str());
    return 128 + summa::bench::StopSignal();
  }
  if (!all_correct.ok()) return Fail(all_correct.status());
  if (absl::GetFlag(FLAGS_check) && !*all_correct) {
    std::fprintf(stderr, "summa-bench-allreduce: --check: not every row ran and is correct\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  summa::KeepFreedMemoryForReuse();
  summa::ParseFlagsOrDie(argc, argv, kUsage);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "driver") return RunDriver(argc, argv);
  if (role == "summa_rank" || role == "raw_rank" || role == "grpc_rank") return RunRankRole(role);
  if (role == "raw_server" || role == "grpc_server") {
    summa::bench::RawServerOptions o;
    o.group_size = absl::GetFlag(FLAGS_group_size);
    o.bytes = absl::GetFlag(FLAGS_bytes);
    o.port_file = absl::GetFlag(FLAGS_port_file);
    o.timeout = absl::GetFlag(FLAGS_timeout);
    absl::Status status = role == "raw_server" ? summa::bench::RunRawServer(o) : summa::bench::RunGrpcServer(o);
    return status.ok() ? 0 : Fail(status);
  }
  return FlagError(absl::StrCat("--role: unknown role '", role,
                                "' (driver, summa_rank, raw_rank, grpc_rank, raw_server, grpc_server)"));
}
