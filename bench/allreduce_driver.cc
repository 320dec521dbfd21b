#include "bench/allreduce_driver.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/allreduce_report.h"
#include "bench/child_process.h"
#include "bench/invocation.h"
#include "common/status_macros.h"

namespace summa::bench {
namespace {

namespace fs = std::filesystem;

// How long a server gets to exit after SIGTERM before it is killed.
constexpr absl::Duration kStopGrace = absl::Seconds(10);

bool Contains(const std::vector<std::string>& list, absl::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// The impl column: "summa" on one server, "summa, k shards" on k.
std::string RowLabel(absl::string_view impl, int shards) {
  return shards == 1 ? std::string(impl) : absl::StrCat(impl, ", ", shards, " shards");
}

std::string ConfigName(absl::string_view impl, int ranks, int64_t bytes) {
  return absl::StrCat(impl, ", ", ranks, " ranks, ", bytes > 0 ? FormatByteSize(bytes) : "every size");
}

// Builds the table from what ranks reported for one size: checks that every rank reported once.
absl::StatusOr<TableRow> RowFromReports(absl::string_view impl, int ranks, int64_t bytes,
                                        const std::vector<RankReport>& all) {
  std::vector<RankReport> reports;
  for (const RankReport& r : all) {
    if (r.bytes == bytes) reports.push_back(r);
  }
  std::sort(reports.begin(), reports.end(),
            [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  std::vector<int> seen;
  for (const RankReport& r : reports) seen.push_back(r.rank);
  std::vector<int> expected(ranks);
  for (int r = 0; r < ranks; ++r) expected[r] = r;
  if (seen != expected) {
    return absl::DataLossError(absl::StrCat("expected one result line from each of ranks 0..",
                                            ranks - 1, " for ", FormatByteSize(bytes), ", got ranks [",
                                            absl::StrJoin(seen, ","), "]"));
  }
  TableRow row;
  row.impl = std::string(impl);
  row.ranks = ranks;
  row.bytes = bytes;
  SUMMA_ASSIGN_OR_RETURN(row.time_us, MedianOfSlowestRankUs(reports));
  row.correct = std::all_of(reports.begin(), reports.end(), [](const RankReport& r) { return r.correct; });
  return row;
}

class Benchmark {
 public:
  Benchmark(const DriverOptions& options, std::string run_dir)
      : o_(options), run_dir_(std::move(run_dir)) {}

  absl::StatusOr<bool> Run();
  bool keep_run_dir() const { return !failures_.empty(); }

 private:
  // One size of summa, raw or grpc: a fresh server (summa: `shards` of them), `ranks` rank
  // processes, the (largest) server's peak RSS.
  absl::StatusOr<TableRow> RunServerConfig(const std::string& impl, int ranks, int64_t bytes, int shards);
  // Every size of gloo at one rank count, in one torch.distributed job.
  absl::StatusOr<std::vector<TableRow>> RunGloo(int ranks);
  // Every size of mpi at one rank count over one transport ("tcp" or "shm"), in one mpirun job.
  absl::StatusOr<std::vector<TableRow>> RunMpi(int ranks, const std::string& transport);
  // One size of memcpy: one thread copying the tensor's bytes between two buffers touched first,
  // the host's copy rate (the physical limit of anything that moves the bytes through memory).
  TableRow RunMemcpy(int64_t bytes);
  // The rows of a job that ran every size (gloo, mpi) from what its ranks printed.
  std::vector<TableRow> RowsOfEverySize(const std::string& label, int ranks, const std::string& output);

  // Prints a line of the report (and keeps it for --out).
  void Emit(const std::string& line);
  // A row for a configuration that failed, its error kept for the notes under the table.
  TableRow FailedRow(const std::string& impl, int ranks, int64_t bytes, const absl::Status& error);
  void EmitRow(const TableRow& row);
  // Marks `row` not correct when a rank's result for its size was wrong, and says which.
  void ExplainIfIncorrect(TableRow& row, const std::vector<RankReport>& reports);
  std::string RunPath(const std::string& name) const { return absl::StrCat(run_dir_, "/", name); }
  // A throwaway CA and certificates for the summa-tls rows (scripts/make-certs.sh), in the run's
  // directory.
  absl::Status MakeCerts(absl::Time deadline);
  // "--tls_ca=ca.pem" with the file's path in the run's certificates.
  std::string TlsFlag(absl::string_view flag) const {
    const size_t eq = flag.find('=');
    return absl::StrCat(flag.substr(0, eq + 1), certs_, "/", flag.substr(eq + 1));
  }
  std::string certs_;

  const DriverOptions& o_;
  const std::string run_dir_;
  std::string report_;
  std::vector<std::string> failures_;  // "[k] config: what went wrong"
  bool all_correct_ = true;
};

void Benchmark::Emit(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  absl::StrAppend(&report_, line, "\n");
}

TableRow Benchmark::FailedRow(const std::string& impl, int ranks, int64_t bytes,
                              const absl::Status& error) {
  TableRow row;
  row.impl = impl;
  row.ranks = ranks;
  row.bytes = bytes;
  row.note = absl::StrCat("FAILED [", failures_.size() + 1, "]");
  std::string why = error.ToString();
  if (absl::IsDeadlineExceeded(error)) {
    absl::StrAppend(&why, " (--timeout=", absl::FormatDuration(o_.timeout), ")");
  }
  failures_.push_back(absl::StrCat("[", failures_.size() + 1, "] ", ConfigName(impl, ranks, bytes),
                                   ": ", why));
  std::fprintf(stderr, "%s\n", failures_.back().c_str());
  return row;
}

void Benchmark::ExplainIfIncorrect(TableRow& row, const std::vector<RankReport>& reports) {
  for (const RankReport& r : reports) {
    if (r.bytes == row.bytes && !r.correct) {
      row.correct = false;
      row.note = absl::StrCat("no [", failures_.size() + 1, "]");
      failures_.push_back(absl::StrCat("[", failures_.size() + 1, "] ",
                                       ConfigName(row.impl, row.ranks, row.bytes), ": rank ", r.rank,
                                       ": ", r.detail));
      return;
    }
  }
}

void Benchmark::EmitRow(const TableRow& row) {
  all_correct_ = all_correct_ && row.correct;
  Emit(FormatTableRow(row));
}

absl::Status Benchmark::MakeCerts(absl::Time deadline) {
  const std::string dir = RunPath("certs");
  ChildOptions make;
  make.name = "scripts/make-certs.sh";
  make.log_path = RunPath("make-certs.log");
  make.argv = {"/bin/bash", o_.make_certs, dir};
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> process, ChildProcess::Start(make));
  std::vector<std::string> ignored;
  SUMMA_RETURN_IF_ERROR(RunToCompletion({process.get()}, {}, deadline, &ignored));
  certs_ = dir;
  return absl::OkStatus();
}

absl::StatusOr<TableRow> Benchmark::RunServerConfig(const std::string& impl, int ranks, int64_t bytes,
                                                    int shards) {
  const absl::Time deadline = absl::Now() + o_.timeout;
  const std::string label = RowLabel(impl, shards);
  const std::string tag = absl::StrCat(impl, "-k", shards, "-", ranks, "-", FormatByteSize(bytes));
  const bool summa = absl::StartsWith(impl, "summa");
  const bool tls = absl::StartsWith(impl, "summa-tls");
  const bool shm = impl == "summa-shm";
  if (tls && certs_.empty()) SUMMA_RETURN_IF_ERROR(MakeCerts(deadline));
  std::vector<std::unique_ptr<ChildProcess>> server_processes;
  std::vector<std::string> addresses;
  for (int i = 0; i < shards; ++i) {
    const std::string port_file = RunPath(absl::StrCat(tag, "-server", i, ".port"));
    ChildOptions server;
    server.log_path = RunPath(absl::StrCat(tag, "-server", i, ".log"));
    if (summa) {
      // The one server serves both transports: the rows differ only in the ranks' --data_plane.
      server.name = shards == 1 ? "summa-server" : absl::StrCat("summa-server shard ", i);
      server.argv = {o_.server, "--address=127.0.0.1:0", "--data_address=127.0.0.1:0",
                     absl::StrCat("--port_file=", port_file),
                     absl::StrCat("--workers=", ranks),
                     absl::StrCat("--barrier_deadline=", absl::FormatDuration(o_.timeout)),
                     absl::StrCat("--shards=", shards), absl::StrCat("--shard=", i)};
      if (shm) server.argv.push_back(absl::StrCat("--shm_socket=", RunPath(absl::StrCat(tag, "-server", i, ".sock"))));
      // Mutual TLS, as a deployment across machines would run it: the plane and gRPC alike.
      if (tls) {
        for (const char* flag : {"--tls_cert=server.pem", "--tls_key=server.key", "--tls_ca=ca.pem"}) {
          server.argv.push_back(TlsFlag(flag));
        }
      }
    } else {
      server.name = absl::StrCat(impl, " server");
      server.argv = {o_.self, absl::StrCat("--role=", impl, "_server"), absl::StrCat("--port_file=", port_file),
                     absl::StrCat("--group_size=", ranks), absl::StrCat("--bytes=", bytes),
                     absl::StrCat("--timeout=", absl::FormatDuration(o_.timeout))};
    }
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> process, ChildProcess::Start(server));
    SUMMA_ASSIGN_OR_RETURN(const std::string port, WaitForFile(port_file, *process, deadline));
    addresses.push_back("127.0.0.1:" + port);
    server_processes.push_back(std::move(process));
  }

  std::vector<ChildOptions> rank_options(ranks);
  for (int r = 0; r < ranks; ++r) {
    ChildOptions& rank = rank_options[r];
    rank.name = absl::StrCat(label, " rank ", r);
    rank.log_path = RunPath(absl::StrCat(tag, "-rank", r, ".log"));
    rank.capture_stdout = true;
    rank.argv = {o_.self, absl::StrCat("--role=", summa ? "summa" : impl, "_rank"),
                 "--target=" + absl::StrJoin(addresses, ","),
                 absl::StrCat("--rank=", r), absl::StrCat("--group_size=", ranks),
                 absl::StrCat("--bytes=", bytes), absl::StrCat("--iters=", o_.iters),
                 absl::StrCat("--warmup=", o_.warmup),
                 absl::StrCat("--timeout=", absl::FormatDuration(o_.timeout)),
                 absl::StrCat("--channels=", o_.channels)};
    if (summa) {
      rank.argv.push_back(absl::EndsWith(impl, "grpc") ? "--data_plane=grpc"
                          : shm                        ? "--data_plane=shm"
                                                       : "--data_plane=socket");
    }
    if (tls) {
      for (const char* flag : {"--tls_cert=client.pem", "--tls_key=client.key", "--tls_ca=ca.pem"}) {
        rank.argv.push_back(TlsFlag(flag));
      }
    }
    // Rank r counts server r's faults (every server's where there are as many ranks).
    if (r < shards) rank.argv.push_back(absl::StrCat("--server_pid=", server_processes[r]->pid()));
  }
  SUMMA_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ChildProcess>> rank_processes, StartAll(rank_options));
  std::vector<std::string> outputs;
  SUMMA_RETURN_IF_ERROR(RunToCompletion(Pointers(rank_processes), Pointers(server_processes), deadline, &outputs));
  int64_t peak_rss = 0;
  for (const auto& process : server_processes) {
    SUMMA_ASSIGN_OR_RETURN(const int64_t rss, PeakRssBytes(process->pid()));
    peak_rss = std::max(peak_rss, rss);
  }
  for (const auto& process : server_processes) SUMMA_RETURN_IF_ERROR(process->Stop(kStopGrace));

  SUMMA_ASSIGN_OR_RETURN(std::vector<RankReport> reports, ParseRankReports(absl::StrJoin(outputs, "\n")));
  SUMMA_ASSIGN_OR_RETURN(TableRow row, RowFromReports(label, ranks, bytes, reports));
  row.server_peak_rss_mib = static_cast<double>(peak_rss) / (1 << 20);
  // Faults summed over the servers counted (all of them unless there are fewer ranks than shards).
  for (const RankReport& r : reports) {
    if (r.server_faults >= 0 && o_.iters > 0) {
      row.server_faults_per_call = row.server_faults_per_call.value_or(0) + double(r.server_faults) / o_.iters;
    }
  }
  ExplainIfIncorrect(row, reports);
  return row;
}

TableRow Benchmark::RunMemcpy(int64_t bytes) {
  std::unique_ptr<char[]> from(new char[bytes]), to(new char[bytes]);
  for (int64_t i = 0; i < bytes; ++i) from[i] = static_cast<char>(i * 7);
  std::memset(to.get(), 0, bytes);  // touched: no first-touch faults in the timed copies
  std::vector<double> us;
  for (int k = 0; k < o_.warmup + o_.iters; ++k) {
    const absl::Time start = absl::Now();
    std::memcpy(to.get(), from.get(), bytes);
    const double took = absl::ToDoubleMicroseconds(absl::Now() - start);
    if (k >= o_.warmup) us.push_back(took);
  }
  std::sort(us.begin(), us.end());
  TableRow row;
  row.impl = "memcpy (1 thread)";
  row.ranks = 1;
  row.bytes = bytes;
  if (!us.empty()) row.time_us = us[us.size() / 2];
  row.correct = std::memcmp(to.get(), from.get(), bytes) == 0;
  if (!row.correct) row.note = "the copy differs";
  return row;
}

absl::StatusOr<std::vector<TableRow>> Benchmark::RunGloo(int ranks) {
  // Every size runs in one job (starting torch costs seconds); it gets the timeout per size.
  const absl::Time deadline = absl::Now() + o_.timeout * static_cast<double>(o_.sizes.size());
  const std::string store = RunPath(absl::StrCat("gloo-", ranks, ".store"));
  std::vector<ChildOptions> rank_options(ranks);
  for (int r = 0; r < ranks; ++r) {
    ChildOptions& rank = rank_options[r];
    rank.name = absl::StrCat("gloo rank ", r);
    rank.log_path = RunPath(absl::StrCat("gloo-", ranks, "-rank", r, ".log"));
    rank.capture_stdout = true;
    rank.env = {{"OMP_NUM_THREADS", "1"}};
    rank.argv = {o_.python, o_.gloo_script, absl::StrCat("--rank=", r), absl::StrCat("--world=", ranks),
                 absl::StrCat("--store=", store), absl::StrCat("--sizes=", absl::StrJoin(o_.sizes, ",")),
                 absl::StrCat("--iters=", o_.iters), absl::StrCat("--warmup=", o_.warmup),
                 absl::StrCat("--timeout=", absl::ToDoubleSeconds(o_.timeout))};
  }
  SUMMA_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ChildProcess>> rank_processes, StartAll(rank_options));
  std::vector<std::string> outputs;
  SUMMA_RETURN_IF_ERROR(RunToCompletion(Pointers(rank_processes), {}, deadline, &outputs));
  return RowsOfEverySize("gloo", ranks, absl::StrJoin(outputs, "\n"));
}

absl::StatusOr<std::vector<TableRow>> Benchmark::RunMpi(int ranks, const std::string& transport) {
  const std::string label = absl::StrCat("mpi (", transport, ")");
  if (o_.mpirun.empty()) {
    TableRow row;
    row.impl = label;
    row.ranks = ranks;
    row.note = "mpirun is not on PATH (Debian: openmpi-bin, python3-mpi4py)";
    return std::vector<TableRow>{row};
  }
  const absl::Time deadline = absl::Now() + o_.timeout * static_cast<double>(o_.sizes.size());
  ChildOptions job;
  job.name = absl::StrCat("mpirun (", transport, ", ", ranks, " ranks)");
  job.log_path = RunPath(absl::StrCat("mpi-", transport, "-", ranks, ".log"));
  job.capture_stdout = true;
  // ob1 with only the named byte transfer layers (the loopback's TCP, or shared memory), so that
  // no other transport (UCX) is picked; the runtime's own connections on the loopback too.
  // --oversubscribe: more ranks than cores, as every other row runs them.
  job.argv = {o_.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", absl::StrCat(ranks),
              "--mca", "pml", "ob1", "--mca", "btl", transport == "tcp" ? "self,tcp" : "self,vader",
              "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
              "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1",
              o_.python, o_.mpi_script, absl::StrCat("--sizes=", absl::StrJoin(o_.sizes, ",")),
              absl::StrCat("--iters=", o_.iters), absl::StrCat("--warmup=", o_.warmup)};
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> process, ChildProcess::Start(job));
  std::vector<std::unique_ptr<ChildProcess>> processes;
  processes.push_back(std::move(process));
  std::vector<std::string> outputs;
  if (absl::Status ran = RunToCompletion(Pointers(processes), {}, deadline, &outputs); !ran.ok()) {
    // SIGTERM first: mpirun passes it on to its ranks and reaps them (each rank also dies with
    // mpirun, should it have to be killed).
    processes[0]->Stop(kStopGrace).IgnoreError();
    return ran;
  }
  return RowsOfEverySize(label, ranks, absl::StrJoin(outputs, "\n"));
}

std::vector<TableRow> Benchmark::RowsOfEverySize(const std::string& label, int ranks, const std::string& output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::ConsumePrefix(&line, "unavailable ")) {
      TableRow row;
      row.impl = label;
      row.ranks = ranks;
      row.note = std::string(absl::StripAsciiWhitespace(line));
      return {row};
    }
  }
  absl::StatusOr<std::vector<RankReport>> reports = ParseRankReports(output);
  if (!reports.ok()) return {FailedRow(label, ranks, 0, reports.status())};
  std::vector<TableRow> rows;
  for (int64_t bytes : o_.sizes) {
    absl::StatusOr<TableRow> row = RowFromReports(label, ranks, bytes, *reports);
    if (!row.ok()) {
      rows.push_back(FailedRow(label, ranks, bytes, row.status()));
      continue;
    }
    ExplainIfIncorrect(*row, *reports);
    rows.push_back(*std::move(row));
  }
  return rows;
}

absl::StatusOr<bool> Benchmark::Run() {
  Emit(absl::StrCat("Command: ", o_.command_line));
  Emit("");
  Emit(DescribeEnvironment());
  Emit("");
  Emit(absl::StrCat(
      "Each configuration makes ", o_.warmup, " untimed warm-up call(s), then ", o_.iters,
      " timed call(s), of one AllReduce. time = the median over those calls of the slowest rank's "
      "wall time of the call (each rank times its own calls; no barrier between calls; filling "
      "and checking the tensor are not timed). algbw = size / time; busbw = algbw * 2(n-1)/n, "
      "nccl-tests' factor for allreduce. correct = every element of every result (warm-up "
      "included) equals the exact sum. server peak RSS = VmHWM of a fresh server per size "
      "(summa-server, the raw TCP server, or the bare gRPC one), read before it is stopped; "
      "on k summa-server shards, the largest shard's, and the minor faults summed over the shards."));
  Emit("");
  Emit(TableHeader());

  for (const std::string& impl : o_.impls) {
    for (int ranks : o_.ranks) {
      if (impl == "mpi") {
        for (const std::string transport : {"tcp", "shm"}) {
          std::fprintf(stderr, "running mpi (%s), %d ranks, every size ...\n", transport.c_str(), ranks);
          absl::StatusOr<std::vector<TableRow>> rows = RunMpi(ranks, transport);
          if (absl::IsCancelled(rows.status())) return rows.status();
          if (!rows.ok()) rows = std::vector<TableRow>{FailedRow(absl::StrCat("mpi (", transport, ")"), ranks, 0, rows.status())};
          for (const TableRow& row : *rows) EmitRow(row);
        }
        continue;
      }
      if (impl == "memcpy") {
        if (ranks != o_.ranks.front()) continue;  // one thread: the same at every rank count
        for (int64_t bytes : o_.sizes) EmitRow(RunMemcpy(bytes));
        continue;
      }
      if (impl == "gloo") {
        std::fprintf(stderr, "running gloo, %d ranks, every size ...\n", ranks);
        absl::StatusOr<std::vector<TableRow>> rows = RunGloo(ranks);
        if (absl::IsCancelled(rows.status())) return rows.status();
        if (!rows.ok()) rows = std::vector<TableRow>{FailedRow("gloo", ranks, 0, rows.status())};
        for (const TableRow& row : *rows) EmitRow(row);
        continue;
      }
      // Shards are summa-server's; the other servers are one process.
      for (int shards : absl::StartsWith(impl, "summa") ? o_.shards : std::vector<int>{1}) {
        const std::string label = RowLabel(impl, shards);
        for (int64_t bytes : o_.sizes) {
          std::fprintf(stderr, "running %s ...\n", ConfigName(label, ranks, bytes).c_str());
          absl::StatusOr<TableRow> row = RunServerConfig(impl, ranks, bytes, shards);
          if (absl::IsCancelled(row.status())) return row.status();
          EmitRow(row.ok() ? *row : FailedRow(label, ranks, bytes, row.status()));
        }
      }
    }
  }
  if (!failures_.empty()) {
    Emit("");
    for (const std::string& f : failures_) {
      Emit(absl::StrCat("    ", absl::StrReplaceAll(f, {{"\n", "\n    "}})));
    }
  }
  if (!o_.out_path.empty()) {
    std::ofstream out(o_.out_path, std::ios::trunc);
    out << report_;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", o_.out_path));
  }
  return all_correct_;
}

}  // namespace

absl::Status ValidateDriverOptions(const DriverOptions& o) {
  for (const std::string& impl : o.impls) {
    if (std::none_of(std::begin(kImplementations), std::end(kImplementations),
                     [&](const char* known) { return impl == known; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("--impls: unknown implementation '", impl, "' (", absl::StrJoin(kImplementations, ", "), ")"));
    }
  }
  if (o.impls.empty()) return absl::InvalidArgumentError("--impls: name at least one implementation");
  if (o.sizes.empty()) return absl::InvalidArgumentError("--sizes: name at least one size");
  for (int64_t bytes : o.sizes) {
    if (bytes <= 0 || bytes % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes: ", bytes, " bytes is not a positive multiple of 4 (float32)"));
    }
  }
  if (o.ranks.empty()) return absl::InvalidArgumentError("--ranks: name at least one rank count");
  for (int ranks : o.ranks) {
    if (ranks < 1) return absl::InvalidArgumentError("--ranks: every rank count must be at least 1");
  }
  if (o.shards.empty()) return absl::InvalidArgumentError("--shards: name at least one shard count");
  for (int shards : o.shards) {
    if (shards < 1) return absl::InvalidArgumentError("--shards: every shard count must be at least 1");
  }
  if (o.iters < 1) return absl::InvalidArgumentError("--iters must be at least 1");
  if (o.warmup < 0) return absl::InvalidArgumentError("--warmup must not be negative");
  if (o.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("--timeout must be positive");
  const bool summa = std::any_of(o.impls.begin(), o.impls.end(), [](const std::string& i) { return absl::StartsWith(i, "summa"); });
  if (summa && ::access(o.server.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server: no executable summa-server at ", o.server, " (build it, or pass --server)"));
  }
  if (Contains(o.impls, "gloo") && ::access(o.gloo_script.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gloo_script: cannot read ", o.gloo_script));
  }
  if (Contains(o.impls, "mpi") && ::access(o.mpi_script.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--mpi_script: cannot read ", o.mpi_script));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RunAllReduceBenchmark(const DriverOptions& options) {
  SUMMA_RETURN_IF_ERROR(ValidateDriverOptions(options));
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                          "/summa-bench-allreduce.XXXXXX");
  if (::mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory like ", dir_template));
  }
  InstallStopHandler();
  Benchmark benchmark(options, dir_template);
  absl::StatusOr<bool> result = benchmark.Run();
  // Logs of a failed configuration stay for a person to read; a clean run leaves nothing.
  if (result.ok() && benchmark.keep_run_dir()) {
    std::fprintf(stderr, "logs of every process are in %s\n", dir_template.c_str());
  } else {
    std::error_code ignored;
    fs::remove_all(dir_template, ignored);
  }
  return result;
}

}  // namespace summa::bench
