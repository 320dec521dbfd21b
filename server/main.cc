// summa-server: parses flags and runs the parameter-server daemon until SIGINT or SIGTERM.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/allocator.h"
#include "common/byte_size.h"
#include "common/trace.h"
#include "common/rpc/transport.h"
#include "common/flags.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "host:port to listen on; port 0 lets the OS choose (see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the port actually bound to this file once listening");
ABSL_FLAG(std::string, metrics_address, "",
          "host:port for Prometheus metrics at /metrics (e.g. 0.0.0.0:9464; port 0: any free "
          "port); empty: no metrics");
ABSL_FLAG(std::string, metrics_port_file, "", "if set, write the bound metrics port to this file");
ABSL_FLAG(std::string, health_address, "",
          "host:port of a plaintext listener that serves only grpc.health.v1.Health, with the main "
          "port's serving status (no data, no reflection): for probes that cannot speak TLS, such "
          "as kubelet's grpc probes (port 0: any free port); empty: none");
ABSL_FLAG(std::string, health_port_file, "", "if set, write the bound health port to this file");
ABSL_FLAG(std::string, data_address, "",
          "host:port of the socket data plane: the data path (Push, Pull, PushPull, Initialize, "
          "AllReduce) on plain TCP connections of its own beside gRPC, with the same messages and "
          "tokens, 2-4x faster for small calls; workers find it through gRPC and use it unless "
          "told --data_plane=grpc (port 0: any free port). Plaintext: not with --tls_cert. Empty: "
          "none, the data path stays on gRPC");
ABSL_FLAG(std::string, data_port_file, "", "if set, write the bound data-plane port to this file");
ABSL_FLAG(std::string, trace_file, "",
          "if set, write a timeline of the data path (receive, sum, optimizer and wait, per "
          "partition) to this file as Chrome trace JSON when the server stops (open it in "
          "chrome://tracing or ui.perfetto.dev)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this server: serve TLS (with --tls_key); reloaded when the "
          "file changes");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: require every client to present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token members must send (Join, Push, Pull, PushPull, "
          "Heartbeat, Leave, Initialize, AllReduce); empty: those calls are open");
ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the operators' bearer token, needed for Checkpoint (and accepted for every "
          "member call); with any token set and no admin token, admin calls are refused");
ABSL_FLAG(bool, status_needs_token, false,
          "GetStatus needs a worker or admin token too (health and reflection stay open)");
ABSL_FLAG(bool, require_sessions, true,
          "refuse a member's call that carries no session id (its Join returns one; a newer Join "
          "for the same rank fences the older process). false takes session-less calls, from "
          "clients older than sessions, as the rank's");
ABSL_FLAG(int, workers, 1, "number of workers in the job (the sync barrier waits for all of them)");
ABSL_FLAG(std::string, mode, "sync",
          "consistency mode: sync (a step completes when every worker pushed, as the seed), async "
          "(each push applied on arrival), or ssp (async, but a worker more than --staleness steps "
          "ahead of the slowest waits)");
ABSL_FLAG(int, staleness, 2, "ssp: how many steps a worker may run ahead of the slowest");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(10),
          "a worker that makes no call (workers heartbeat) for this long is lost");
ABSL_FLAG(std::string, on_worker_loss, "wait",
          "sync mode, when a worker is lost: wait (for it to rejoin, up to --rejoin_deadline) or "
          "shrink (go on without it, re-sharding the data over the rest)");
ABSL_FLAG(absl::Duration, rejoin_deadline, absl::Minutes(5),
          "with --on_worker_loss=wait: how long a lost worker may take to rejoin before the job "
          "ends with an error");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory for checkpoints (weights, optimizer state, version); the newest whole one is "
          "restored at start; a shard keeps its own in DIR/shard-I-of-K; empty: no checkpoints");
ABSL_FLAG(int64_t, checkpoint_every, 100,
          "write a checkpoint every this many steps (and on SIGTERM); 0: only on SIGTERM. In a "
          "sharded sync job the checkpoints are of the versions that are multiples of it, so that "
          "shards keep the same versions");
ABSL_FLAG(int, keep_checkpoints, 2,
          "keep the newest this many checkpoints. With --shards, a worker that finds the shards "
          "more than one step apart rolls them back to the newest version every shard keeps: 2 "
          "cover one shard's restart; keep more where a shard's newest files may be lost");
ABSL_FLAG(std::string, optimizer, "sgd",
          "optimizer applied to the summed gradient divided by the examples pushed, with "
          "PyTorch's semantics: sgd, adam or adamw (decoupled weight decay)");
ABSL_FLAG(double, lr, 0.1, "learning rate (the schedule's peak)");
ABSL_FLAG(double, momentum, 0.0, "sgd: momentum in [0, 1); 0 is the seed's plain SGD");
ABSL_FLAG(bool, nesterov, false, "sgd: Nesterov momentum (needs --momentum > 0)");
ABSL_FLAG(double, weight_decay, 0.0,
          "weight decay: L2 added to the gradient (sgd, adam), decoupled (adamw)");
ABSL_FLAG(double, beta1, 0.9, "adam, adamw: decay of the first moment, in [0, 1)");
ABSL_FLAG(double, beta2, 0.999, "adam, adamw: decay of the second moment, in [0, 1)");
ABSL_FLAG(double, eps, 1e-8, "adam, adamw: added to the denominator");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "learning-rate schedule over the updates: constant; step (multiply by --lr_gamma every "
          "--lr_step_size updates); cosine (linear warm-up over --lr_warmup_steps, then half a "
          "cosine down to 0 at --lr_total_steps)");
ABSL_FLAG(int64_t, lr_step_size, 0, "step schedule: updates between decays");
ABSL_FLAG(double, lr_gamma, 0.1, "step schedule: the factor of each decay");
ABSL_FLAG(int64_t, lr_warmup_steps, 0, "cosine schedule: updates of linear warm-up");
ABSL_FLAG(int64_t, lr_total_steps, 0, "cosine schedule: the update at which the rate reaches 0");
ABSL_FLAG(std::string, nonfinite, "reject",
          "a pushed gradient holding NaN or infinity: reject (INVALID_ARGUMENT naming rank, step, "
          "partition and element; nothing changes), skip_step (its step applies no update), or "
          "zero (the bad values count as 0)");
ABSL_FLAG(bool, deterministic, false,
          "sync mode: sum each step's pushes in rank order, keeping each push until its step "
          "completes, so that a job's weights are the same bits whatever order pushes arrive in "
          "(costs one partition-sized buffer per worker; the default sums pushes as they arrive, "
          "whose last bits vary with the order once 3 or more workers push)");
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "the dtype workers push gradients and pull weights in: fp32, bf16 (half the bytes; "
          "8 bits of mantissa) or fp16 (half the bytes; 11 bits of mantissa, magnitudes from "
          "6e-8 to 65504). The server sums and keeps the weights in fp32 whatever the wire "
          "carries; workers learn the choice at Join");
ABSL_FLAG(std::string, compress, "none",
          "pushed gradients: none, or topk:RATIO (0 < RATIO < 1): each push carries the RATIO "
          "share of each partition's gradient of largest magnitude, as positions and values, "
          "and the worker keeps the rest and adds it to its next step's gradient (error "
          "feedback); pulls stay dense");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20,
          "largest slice of the flat parameter buffer that one push or pull carries, in bytes");
ABSL_FLAG(int, shards, 1,
          "server shards in the job: each holds the partitions assigned to it (balanced by bytes; "
          "the model needs at least this many partitions: see --partition_bytes), and workers "
          "give every shard's address, in shard order, to --server. Give every shard the same "
          "job flags");
ABSL_FLAG(std::string, coordinator, "",
          "shard 0's host:port, given to every shard of a sharded job (shard 0 ignores it): the "
          "other shards report to it (it answers when its view moves, or after half a second) and "
          "follow its membership view (who is in the group, whether the job has ended), and its "
          "GetStatus shows every shard. They call it "
          "with this server's TLS files (--tls_ca, or --tls_cert when there is none, as the CA to "
          "trust) and --token_file's token. Empty: each shard keeps its own leases");
ABSL_FLAG(int, shard, -1,
          "this server's shard, 0 to --shards - 1; default: 0 for an unsharded job, else the "
          "ordinal that ends $HOSTNAME (a StatefulSet's pod summa-server-1 is shard 1)");
ABSL_FLAG(absl::Duration, barrier_deadline, absl::Minutes(10),
          "how long a pull or an AllReduce waits for the rest of its group before it fails with "
          "DEADLINE_EXCEEDED (e.g. 30s, 10m)");
// Limits (server/core/limits.h): what the server holds for its callers. Past one, a call is refused
// with RESOURCE_EXHAUSTED naming the flag. A peer is a member rank, or a client address.
ABSL_FLAG(std::string, max_message_bytes, "256MiB",
          "largest message the server receives or sends (gRPC refuses larger ones in its "
          "transport); at least --partition_bytes (and 4MiB, an AllReduce chunk) plus 64KiB");
ABSL_FLAG(std::string, max_model_bytes, "16GiB",
          "largest model a Join may declare (the server allocates it before any value arrives)");
ABSL_FLAG(int64_t, max_parked_calls, 65536,
          "pulls and AllReduce calls waiting for their step or round, in total");
ABSL_FLAG(int64_t, max_parked_calls_per_peer, 4096,
          "pulls and AllReduce calls waiting for their step or round, per peer");
ABSL_FLAG(int64_t, max_collectives, 4096,
          "AllReduce collectives kept (idle ones, least recently used first, are forgotten to make "
          "room)");
ABSL_FLAG(int64_t, max_open_collectives_per_peer, 1024,
          "AllReduce rounds in progress that one peer may have opened");
ABSL_FLAG(std::string, max_allreduce_bytes, "4GiB",
          "bytes of the AllReduce buffers (sums in progress, and buffers kept for the next rounds)");
ABSL_FLAG(std::string, max_bytes_in_flight_per_peer, "2GiB",
          "bytes of one peer's requests the server holds: AllReduce contributions until their "
          "round completes, pushed values while they are applied");
ABSL_FLAG(double, join_rate, 50,
          "joins per second the server accepts, after a burst of max(this, 2 x --workers)");

namespace {

// The flags as server options, or the first bad one's message.
absl::StatusOr<summa::server::ServerOptions> OptionsFromFlags() {
  namespace server = summa::server;
  using server::LimitOptions;
  server::ServerOptions o;
  o.world_size = absl::GetFlag(FLAGS_workers);
  absl::StatusOr<server::Mode> mode = server::ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return mode.status();
  o.mode = *mode;
  o.staleness = absl::GetFlag(FLAGS_staleness);
  absl::StatusOr<server::OnWorkerLoss> loss = server::ParseOnWorkerLoss(absl::GetFlag(FLAGS_on_worker_loss));
  if (!loss.ok()) return loss.status();
  o.on_worker_loss = *loss;
  absl::StatusOr<server::NonFinite> nonfinite = server::ParseNonFinite(absl::GetFlag(FLAGS_nonfinite));
  if (!nonfinite.ok()) return nonfinite.status();
  o.nonfinite = *nonfinite;
  o.deterministic = absl::GetFlag(FLAGS_deterministic);
  absl::StatusOr<summa::WireDType> wire = summa::ParseWireDType(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire.ok()) return wire.status();
  o.wire_dtype = *wire;
  absl::StatusOr<summa::Compression> compression = summa::ParseCompression(absl::GetFlag(FLAGS_compress));
  if (!compression.ok()) return compression.status();
  o.compression = *compression;
  server::OptimizerOptions& opt = o.optimizer;
  opt.name = absl::GetFlag(FLAGS_optimizer);
  opt.learning_rate = absl::GetFlag(FLAGS_lr);
  opt.momentum = absl::GetFlag(FLAGS_momentum);
  opt.nesterov = absl::GetFlag(FLAGS_nesterov);
  opt.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  opt.beta1 = absl::GetFlag(FLAGS_beta1);
  opt.beta2 = absl::GetFlag(FLAGS_beta2);
  opt.eps = absl::GetFlag(FLAGS_eps);
  absl::StatusOr<server::LrSchedule> schedule = server::ParseLrSchedule(absl::GetFlag(FLAGS_lr_schedule));
  if (!schedule.ok()) return schedule.status();
  opt.schedule = *schedule;
  opt.step_size = absl::GetFlag(FLAGS_lr_step_size);
  opt.gamma = absl::GetFlag(FLAGS_lr_gamma);
  opt.warmup_steps = absl::GetFlag(FLAGS_lr_warmup_steps);
  opt.total_steps = absl::GetFlag(FLAGS_lr_total_steps);
  o.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.shard = absl::GetFlag(FLAGS_shard);
  if (o.shard == -1) {
    absl::StatusOr<int> ordinal = o.shards > 1 ? summa::server::ShardFromHostname(std::getenv("HOSTNAME")) : 0;
    if (!ordinal.ok()) return ordinal.status();
    o.shard = *ordinal;
  }
  o.barrier_deadline = absl::GetFlag(FLAGS_barrier_deadline);
  o.lease = absl::GetFlag(FLAGS_lease);
  o.rejoin_deadline = absl::GetFlag(FLAGS_rejoin_deadline);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  // Shards may share a directory: each keeps (and prunes, and restores) its own checkpoints.
  if (!o.checkpoint_dir.empty() && o.shards > 1) {
    o.checkpoint_dir = absl::StrCat(o.checkpoint_dir, "/shard-", o.shard, "-of-", o.shards);
  }
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  o.require_sessions = absl::GetFlag(FLAGS_require_sessions);
  LimitOptions& l = o.limits;
  const struct {
    int64_t* field;
    const char* name;
    std::string text;
  } sizes[] = {
      {&l.max_message_bytes, "max_message_bytes", absl::GetFlag(FLAGS_max_message_bytes)},
      {&l.max_model_bytes, "max_model_bytes", absl::GetFlag(FLAGS_max_model_bytes)},
      {&l.max_allreduce_bytes, "max_allreduce_bytes", absl::GetFlag(FLAGS_max_allreduce_bytes)},
      {&l.max_bytes_in_flight_per_peer, "max_bytes_in_flight_per_peer",
       absl::GetFlag(FLAGS_max_bytes_in_flight_per_peer)},
  };
  for (const auto& size : sizes) {
    absl::StatusOr<int64_t> bytes = summa::ParseByteSize(size.text);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--", size.name, ": ", bytes.status().message()));
    *size.field = *bytes;
  }
  l.max_parked_calls = absl::GetFlag(FLAGS_max_parked_calls);
  l.max_parked_calls_per_peer = absl::GetFlag(FLAGS_max_parked_calls_per_peer);
  l.max_collectives = absl::GetFlag(FLAGS_max_collectives);
  l.max_open_collectives_per_peer = absl::GetFlag(FLAGS_max_open_collectives_per_peer);
  l.join_rate = absl::GetFlag(FLAGS_join_rate);
  if (absl::Status valid = server::ValidateOptions(o); !valid.ok()) return valid;
  return o;
}

absl::StatusOr<summa::EndpointSecurity> SecurityFromFlags() {
  summa::EndpointSecurity s;
  s.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
  if (absl::Status valid = summa::ValidateTls(s.tls, /*server=*/true); !valid.ok()) return valid;
  std::string worker, admin;
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    absl::StatusOr<std::string> t = summa::ReadTokenFile(absl::GetFlag(FLAGS_token_file));
    if (!t.ok()) return t.status();
    worker = *std::move(t);
  }
  if (!absl::GetFlag(FLAGS_admin_token_file).empty()) {
    absl::StatusOr<std::string> t = summa::ReadTokenFile(absl::GetFlag(FLAGS_admin_token_file));
    if (!t.ok()) return t.status();
    admin = *std::move(t);
  }
  if (!worker.empty() && worker == admin) {
    return absl::InvalidArgumentError("--token_file and --admin_token_file hold the same token: give "
                                      "operators a token of their own");
  }
  if (absl::GetFlag(FLAGS_status_needs_token) && worker.empty() && admin.empty()) {
    return absl::InvalidArgumentError("--status_needs_token needs --token_file or --admin_token_file");
  }
  if (absl::Status m = summa::CheckMetricsAddress(absl::GetFlag(FLAGS_metrics_address), s.tls); !m.ok()) {
    return m;
  }
  s.tokens = summa::TokenCheck(worker, admin, absl::GetFlag(FLAGS_status_needs_token));
  return s;
}

absl::StatusOr<summa::server::Coordinator> CoordinatorFromFlags() {
  summa::server::Coordinator c;
  c.address = absl::GetFlag(FLAGS_coordinator);
  if (c.address.empty()) return c;
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), ca = absl::GetFlag(FLAGS_tls_ca);
  if (!cert.empty()) c.security.tls = {cert, absl::GetFlag(FLAGS_tls_key), ca.empty() ? cert : ca};
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    absl::StatusOr<std::string> t = summa::ReadTokenFile(absl::GetFlag(FLAGS_token_file));
    if (!t.ok()) return t.status();
    c.security.token = *std::move(t);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  summa::KeepFreedMemoryForReuse();
  summa::ParseFlagsOrDie(argc, argv,
                         "the Summa parameter server. Holds the master weights, sums "
                         "the gradients workers push, applies the optimizer and serves the new "
                         "parameters; also serves AllReduce.\n\n  summa-server --workers=2 --lr=0.2");
  absl::StatusOr<summa::server::ServerOptions> parsed = OptionsFromFlags();
  if (!parsed.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  summa::server::ServerOptions& options = *parsed;
  std::unique_ptr<summa::Tracer> tracer;
  if (!absl::GetFlag(FLAGS_trace_file).empty()) {
    absl::StatusOr<std::unique_ptr<summa::Tracer>> opened =
        summa::Tracer::Open(absl::GetFlag(FLAGS_trace_file), "summa-server");
    if (!opened.ok()) {
      std::fprintf(stderr, "summa-server: %s\n", std::string(opened.status().message()).c_str());
      return 2;
    }
    tracer = *std::move(opened);
    options.tracer = tracer.get();
  }
  absl::StatusOr<summa::EndpointSecurity> security = SecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<summa::server::Coordinator> coordinator = CoordinatorFromFlags();
  if (!coordinator.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(coordinator.status().message()).c_str());
    return 2;
  }
  summa::BlockTerminationSignals();
  auto server = summa::server::SummaServer::Start(absl::GetFlag(FLAGS_address), options,
                                                  absl::GetFlag(FLAGS_metrics_address), *std::move(security),
                                                  absl::GetFlag(FLAGS_health_address), *std::move(coordinator),
                                                  absl::GetFlag(FLAGS_data_address));
  if (!server.ok()) {
    std::fprintf(stderr, "summa-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::printf("summa-server listening on port %d: %d workers, %s mode, %s, partitions of %lld bytes%s\n",
              port, options.world_size, summa::server::ModeName(options.mode),
              (*server)->core().Status().optimizer.c_str(), static_cast<long long>(options.partition_bytes),
              options.shards > 1 ? absl::StrCat(", shard ", options.shard, " of ", options.shards).c_str() : "");
  std::fflush(stdout);
  // Writes a bound port to its --*_port_file, when one is given.
  auto write_port = [](const std::string& file, int bound) {
    if (file.empty()) return true;
    absl::Status written = summa::WriteFileAtomically(file, absl::StrCat(bound, "\n"));
    if (!written.ok()) std::fprintf(stderr, "summa-server: %s\n", std::string(written.message()).c_str());
    return written.ok();
  };
  if (!write_port(absl::GetFlag(FLAGS_port_file), port)) return 1;
  if ((*server)->metrics_port() != 0) {
    std::printf("summa-server: metrics on port %d (/metrics)\n", (*server)->metrics_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_metrics_port_file), (*server)->metrics_port())) return 1;
  }
  if ((*server)->health_port() != 0) {
    std::printf("summa-server: health (plaintext, grpc.health.v1.Health only) on port %d\n",
                (*server)->health_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_health_port_file), (*server)->health_port())) return 1;
  }
  if ((*server)->data_port() != 0) {
    std::printf("summa-server: socket data plane (plaintext) on port %d\n", (*server)->data_port());
    std::fflush(stdout);
    if (!write_port(absl::GetFlag(FLAGS_data_port_file), (*server)->data_port())) return 1;
  }
  summa::server::SummaServer& running = **server;
  running.StopOnTerminationSignals();
  const std::string job_error = running.Wait();
  running.Shutdown();
  if (tracer != nullptr) {
    if (absl::Status s = tracer->Close(); !s.ok()) {
      std::fprintf(stderr, "summa-server: %s\n", std::string(s.message()).c_str());
    }
  }
  if (!job_error.empty()) {
    std::fprintf(stderr, "summa-server: the job ended: %s\n", job_error.c_str());
    return 1;
  }
  return 0;
}
