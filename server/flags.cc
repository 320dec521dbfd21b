#include "server/flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/compression.h"

// The structs whose defaults the flags take.
using summa::server::Coordinator;
using summa::server::DilocoDefaults;
using summa::server::LimitOptions;
using summa::OptimizerOptions;
using summa::server::ServerOptions;
using summa::LrScheduleName;
using summa::server::ModeName;
using summa::server::NonFiniteName;
using summa::server::OnWorkerLossName;

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
          "AllReduce) on TCP connections of its own beside gRPC, with the same messages and "
          "tokens, 2-4x faster for small calls; workers find it through gRPC and use it unless "
          "told --data_plane=grpc (port 0: any free port). With --tls_cert it speaks TLS 1.3 with "
          "the same certificates (and, with --tls_ca, requires client certificates as gRPC does), "
          "kernel TLS where the kernel offers it. Empty: none, the data path stays on gRPC");
ABSL_FLAG(std::string, shm_socket, "",
          "path of a Unix socket for the shared-memory plane: workers on this host (and only they: "
          "the DataPlane call names the path, and a worker checks the socket is this server's) "
          "send the data path's calls there and place their bytes in memory segments shared with "
          "this process, which sums straight out of them and writes replies into segments they "
          "map read-only; the same messages and tokens as the socket data plane, never TLS. "
          "Workers prefer it (--data_plane=auto) over the socket plane and gRPC. The directory "
          "must be shared with the workers (a pod's emptyDir, /run/summa). Empty: none");
ABSL_FLAG(std::string, data_port_file, "", "if set, write the bound data-plane port to this file");
ABSL_FLAG(std::string, trace_file, "",
          "if set, write a timeline of the data path (receive, sum, optimizer and wait, per "
          "partition) to this file as Chrome trace JSON when the server stops (open it in "
          "chrome://tracing or ui.perfetto.dev)");
ABSL_FLAG(std::string, tls_cert, summa::TlsFiles().cert,
          "PEM certificate chain of this server: serve TLS (with --tls_key); reloaded when the "
          "file changes");
ABSL_FLAG(std::string, tls_key, summa::TlsFiles().key, "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, summa::TlsFiles().ca,
          "PEM CA: require every client to present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, token_file, summa::TokenFiles().worker,
          "file listing the bearer tokens members must send (every call but Checkpoint, Export and "
          "GetStatus: server/rpc/method_roles.h), one a line (blank lines and # comments skipped): "
          "TOKEN alone speaks for any rank; TOKEN rank=R only for rank R (its Join for rank -1 gets "
          "R, and a call as another rank is PERMISSION_DENIED). Read again when it changes (every "
          "5 s; see --token_grace_period). Empty: those calls are open");
ABSL_FLAG(std::string, admin_token_file, summa::TokenFiles().admin,
          "file listing the operators' bearer tokens, one a line, needed for Checkpoint and Export "
          "(and accepted for every member call, as any rank); with any token set and no admin "
          "token, admin calls are refused. Read again when it changes, as --token_file");
ABSL_FLAG(absl::Duration, token_grace_period, summa::TokenFiles().grace,
          "how long a token taken out of --token_file or --admin_token_file is still accepted "
          "(the time to roll the new one out to every client); 0: refused at the reload");
ABSL_FLAG(bool, status_needs_token, summa::TokenFiles().status_needs_token,
          "GetStatus needs a worker or admin token too (health and reflection stay open)");
ABSL_FLAG(bool, require_sessions, ServerOptions().require_sessions,
          "refuse a member's call that carries no session id (its Join returns one; a newer Join "
          "for the same rank fences the older process). false takes session-less calls, from "
          "clients older than sessions, as the rank's");
ABSL_FLAG(std::string, workers, "1",
          "workers in the job: N (the sync barrier waits for all of them), or MIN:MAX for an "
          "elastic job that starts with ranks 0..MIN-1 and admits up to MAX in all while it runs "
          "(a worker with a new --rank, or --rank=-1, joins at the next step boundary and the "
          "global batch is split over the larger group from that step; under --on_worker_loss="
          "shrink the group shrinks again, down to any size; one server shard only)");
ABSL_FLAG(std::string, mode, ModeName(ServerOptions().mode),
          "consistency mode: sync (a step completes when every worker pushed, as the seed; all but "
          "--backup_workers of them), async "
          "(each push applied on arrival), ssp (async, but a worker more than --staleness steps "
          "ahead of the slowest waits), diloco (DiLoCo: each worker takes --sync_every local steps "
          "with its own inner optimizer, then pushes the change of its weights; an outer step "
          "averages the group's, weighted by examples, under --outer_optimizer) or diloco-async "
          "(each worker's change applied as it arrives, as a 1/group-size share)");
ABSL_FLAG(int, sync_every, DilocoDefaults().sync_every,
          "diloco: H, the local steps each worker takes between exchanges with the server (the "
          "paper's 500; 1 exchanges every step). A worker's place in the data follows from H, so "
          "a checkpoint restores only into the same H");
ABSL_FLAG(std::string, outer_optimizer, DilocoDefaults().outer_optimizer,
          "diloco: the outer optimizer the server applies to the averaged pseudo-gradient: "
          "nesterov (SGD with Nesterov momentum, the paper's) or sgd (heavy-ball momentum; with "
          "--outer_momentum=0 --outer_lr=1 the average of the workers' weights)");
ABSL_FLAG(double, outer_lr, DilocoDefaults().outer_lr,
          "diloco: the outer learning rate (the --lr_schedule flags, when given, schedule it over "
          "the outer steps)");
ABSL_FLAG(double, outer_momentum, DilocoDefaults().outer_momentum, "diloco: the outer momentum, in [0, 1)");
ABSL_FLAG(int, staleness, ServerOptions().staleness,
          "ssp: how many steps a worker may run ahead of the slowest");
ABSL_FLAG(int, backup_workers, ServerOptions().backup_workers,
          "sync mode: backup workers, B (Chen et al. 2016): a step completes once the first "
          "group size - B workers have pushed it, without waiting for the slowest B; a push that "
          "comes after its step completed is dropped (not summed; counted per worker in status "
          "and metrics as late_pushes) and answered with the newest weights, from which that "
          "worker goes on, skipping the steps it missed. 0 (the default) waits for every worker; "
          "B must be less than the workers the job starts with (--workers' MIN)");
ABSL_FLAG(absl::Duration, lease, ServerOptions().lease,
          "a worker that makes no call (workers heartbeat) for this long is lost");
ABSL_FLAG(std::string, on_worker_loss, OnWorkerLossName(ServerOptions().on_worker_loss),
          "sync mode, when a worker is lost: wait (for it to rejoin, up to --rejoin_deadline) or "
          "shrink (go on without it, re-sharding the data over the rest)");
ABSL_FLAG(absl::Duration, rejoin_deadline, ServerOptions().rejoin_deadline,
          "with --on_worker_loss=wait: how long a lost worker may take to rejoin before the job "
          "ends with an error");
ABSL_FLAG(std::string, checkpoint_dir, ServerOptions().checkpoint_dir,
          "directory for checkpoints (weights, optimizer state, version); the newest whole one is "
          "restored at start; a shard keeps its own in DIR/shard-I-of-K. A job restarted with "
          "another --shards (or none) restores from the newest version that every shard of the "
          "old count keeps there, each shard taking its partitions from whichever old shard's "
          "file holds them (same --partition_bytes); empty: no checkpoints");
ABSL_FLAG(int64_t, checkpoint_every, ServerOptions().checkpoint_every,
          "write a checkpoint every this many steps (and on SIGTERM); 0: only on SIGTERM. In a "
          "sharded sync job the checkpoints are of the versions that are multiples of it, so that "
          "shards keep the same versions. With --mode=diloco a step is an exchange (H local steps "
          "of every worker), and the default is 1");
ABSL_FLAG(int, keep_checkpoints, ServerOptions().keep_checkpoints,
          "keep the newest this many checkpoints. With --shards, a worker that finds the shards "
          "more than one step apart rolls them back to the newest version every shard keeps: 2 "
          "cover one shard's restart; keep more where a shard's newest files may be lost");
ABSL_FLAG(std::string, export_dir, ServerOptions().export_dir,
          "directory the Export call writes safetensors files into (a caller names the file, "
          "never the directory); empty: --checkpoint_dir");
ABSL_FLAG(std::string, export, ServerOptions().export_path,
          "write the final weights (float32, the model's tensor names and shapes) to this "
          "safetensors file as the server shuts down; not with --shards>1 (summa-checkpoint export "
          "assembles a sharded job's checkpoints); empty: none");
ABSL_FLAG(std::string, init_from, ServerOptions().init_from,
          "safetensors file the model starts from: read and checked at start; the first Join must "
          "describe the same tensors (names, order, shapes) and the model takes the file's values "
          "instead of the joiner's. A checkpoint restored at start takes precedence; empty: the "
          "first joiner's values");
ABSL_FLAG(std::string, optimizer, OptimizerOptions().name,
          "optimizer applied to the summed gradient divided by the examples pushed, with "
          "PyTorch's semantics: sgd, adam, adamw (decoupled weight decay) or adagrad");
ABSL_FLAG(double, lr, OptimizerOptions().learning_rate, "learning rate (the schedule's peak)");
ABSL_FLAG(double, momentum, OptimizerOptions().momentum,
          "sgd: momentum in [0, 1); 0 is the seed's plain SGD");
ABSL_FLAG(bool, nesterov, OptimizerOptions().nesterov, "sgd: Nesterov momentum (needs --momentum > 0)");
ABSL_FLAG(double, weight_decay, OptimizerOptions().weight_decay,
          "weight decay: L2 added to the gradient (sgd, adam), decoupled (adamw)");
ABSL_FLAG(double, beta1, OptimizerOptions().beta1, "adam, adamw: decay of the first moment, in [0, 1)");
ABSL_FLAG(double, beta2, OptimizerOptions().beta2, "adam, adamw: decay of the second moment, in [0, 1)");
ABSL_FLAG(double, eps, OptimizerOptions().eps, "adam, adamw, adagrad: added to the denominator");
ABSL_FLAG(std::string, lr_schedule, LrScheduleName(OptimizerOptions().schedule),
          "learning-rate schedule over the updates: constant; step (multiply by --lr_gamma every "
          "--lr_step_size updates); cosine (linear warm-up over --lr_warmup_steps, then half a "
          "cosine down to 0 at --lr_total_steps)");
ABSL_FLAG(int64_t, lr_step_size, OptimizerOptions().step_size, "step schedule: updates between decays");
ABSL_FLAG(double, lr_gamma, OptimizerOptions().gamma, "step schedule: the factor of each decay");
ABSL_FLAG(int64_t, lr_warmup_steps, OptimizerOptions().warmup_steps,
          "cosine schedule: updates of linear warm-up");
ABSL_FLAG(int64_t, lr_total_steps, OptimizerOptions().total_steps,
          "cosine schedule: the update at which the rate reaches 0");
ABSL_FLAG(std::string, nonfinite, NonFiniteName(ServerOptions().nonfinite),
          "a pushed gradient holding NaN or infinity: reject (INVALID_ARGUMENT naming rank, step, "
          "partition and element; nothing changes), skip_step (its step applies no update), or "
          "zero (the bad values count as 0)");
ABSL_FLAG(bool, deterministic, ServerOptions().deterministic,
          "sync mode: sum each step's pushes in rank order, keeping each push until its step "
          "completes, so that a job's weights are the same bits whatever order pushes arrive in "
          "(costs one partition-sized buffer per worker; the default sums pushes as they arrive, "
          "whose last bits vary with the order once 3 or more workers push)");
ABSL_FLAG(std::string, wire_dtype, std::string(summa::WireDTypeName(ServerOptions().wire_dtype)),
          "the dtype workers push gradients and pull weights in: fp32, bf16 (half the bytes; "
          "8 bits of mantissa) or fp16 (half the bytes; 11 bits of mantissa, magnitudes from "
          "6e-8 to 65504). The server sums and keeps the weights in fp32 whatever the wire "
          "carries; workers learn the choice at Join");
ABSL_FLAG(std::string, compress, summa::CompressionName(ServerOptions().compression),
          "pushed gradients: none, or topk:RATIO (0 < RATIO < 1): each push carries the RATIO "
          "share of each partition's gradient of largest magnitude, as positions and values, "
          "and the worker keeps the rest and adds it to its next step's gradient (error "
          "feedback); pulls stay dense");
ABSL_FLAG(int64_t, partition_bytes, ServerOptions().partition_bytes,
          "largest slice of the flat parameter buffer that one push or pull carries, in bytes");
ABSL_FLAG(int, shards, ServerOptions().shards,
          "server shards in the job: each holds the partitions assigned to it (balanced by bytes; "
          "the model needs at least this many partitions: see --partition_bytes), and workers "
          "give every shard's address, in shard order, to --server. Give every shard the same "
          "job flags");
ABSL_FLAG(std::string, coordinator, Coordinator().address,
          "shard 0's host:port, given to every shard of a sharded job (shard 0 ignores it): the "
          "other shards report to it (it answers when its view moves, or after half a second) and "
          "follow its membership view (who is in the group, whether the job has ended), and its "
          "GetStatus shows every shard. They call it "
          "with this server's TLS files (--tls_ca, or --tls_cert when there is none, as the CA to "
          "trust) and --token_file's first bare token (one scoped to no rank). Empty: each shard "
          "keeps its own leases");
// -1 is no shard: it stands for "find it", which no options struct can hold.
ABSL_FLAG(int, shard, -1,
          "this server's shard, 0 to --shards - 1; default: 0 for an unsharded job, else the "
          "ordinal that ends $HOSTNAME (a StatefulSet's pod summa-server-1 is shard 1)");
ABSL_FLAG(absl::Duration, barrier_deadline, ServerOptions().barrier_deadline,
          "how long a pull or an AllReduce waits for the rest of its group before it fails with "
          "DEADLINE_EXCEEDED (e.g. 30s, 10m). With --mode=diloco a pull waits this long per local "
          "step of an exchange (H times it): it waits for every member's H steps");
// Limits (server/core/limits.h): what the server holds for its callers. Past one, a call is refused
// with RESOURCE_EXHAUSTED naming the flag. A peer is a member rank, or a client address.
ABSL_FLAG(std::string, max_message_bytes, summa::FormatByteSize(LimitOptions().max_message_bytes),
          "largest message the server receives or sends (gRPC refuses larger ones in its "
          "transport); at least --partition_bytes (and 4MiB, an AllReduce chunk) plus 64KiB");
ABSL_FLAG(std::string, max_model_bytes, summa::FormatByteSize(LimitOptions().max_model_bytes),
          "largest model a Join may declare (the server allocates it before any value arrives)");
ABSL_FLAG(std::string, max_table_bytes, summa::FormatByteSize(LimitOptions().max_table_bytes),
          "bytes this shard's embedding tables may hold (rows, their optimizer state and index, "
          "ids waiting for admission); a pull that would create a row past it is refused with "
          "RESOURCE_EXHAUSTED. 0: no bound");
ABSL_FLAG(int64_t, max_parked_calls, LimitOptions().max_parked_calls,
          "pulls and AllReduce calls waiting for their step or round, in total");
ABSL_FLAG(int64_t, max_parked_calls_per_peer, LimitOptions().max_parked_calls_per_peer,
          "pulls and AllReduce calls waiting for their step or round, per peer");
ABSL_FLAG(int64_t, max_collectives, LimitOptions().max_collectives,
          "AllReduce collectives kept (idle ones, least recently used first, are forgotten to make "
          "room)");
ABSL_FLAG(int64_t, max_open_collectives_per_peer, LimitOptions().max_open_collectives_per_peer,
          "AllReduce rounds in progress that one peer may have opened");
ABSL_FLAG(std::string, max_allreduce_bytes, summa::FormatByteSize(LimitOptions().max_allreduce_bytes),
          "bytes of the AllReduce buffers (sums in progress, and buffers kept for the next rounds)");
ABSL_FLAG(std::string, max_bytes_in_flight_per_peer,
          summa::FormatByteSize(LimitOptions().max_bytes_in_flight_per_peer),
          "bytes of one peer's requests the server holds: AllReduce contributions until their "
          "round completes, pushed values while they are applied");
ABSL_FLAG(double, join_rate, LimitOptions().join_rate,
          "joins per second the server accepts, after a burst of max(this, 2 x --workers)");
ABSL_FLAG(int64_t, max_data_plane_connections, LimitOptions().max_data_plane_connections,
          "connections the socket data plane (--data_address) holds at once, each with a thread; "
          "one more is refused");
ABSL_FLAG(int64_t, max_data_plane_connections_in_hello, LimitOptions().max_data_plane_connections_in_hello,
          "data-plane connections at once that have not yet passed their hello (the token check); a "
          "newer one past this closes the oldest of the source holding the most, those that have "
          "sent nothing first, so that connections without a token cannot shut members out");
ABSL_FLAG(int64_t, max_data_plane_connections_in_hello_per_source,
          LimitOptions().max_data_plane_connections_in_hello_per_source,
          "data-plane connections in their hello at once from one address (host, any port); a "
          "newer one past this closes that address's oldest, those that have sent nothing first");
ABSL_FLAG(absl::Duration, data_plane_hello_timeout, LimitOptions().data_plane_hello_timeout,
          "how long a data-plane connection has, from its accept, to send its hello (the token) "
          "before it is closed");

namespace summa::server {
namespace {

// Set to other than its default. This Abseil keeps whether a flag was on the command line
// private, so a flag given its default value counts as not given: it is ignored where it does not
// apply (--mode=diloco --lr=0.1), which changes nothing either way.
bool OffDefault(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

// --mode=diloco's flags into `o`: H, and the outer optimizer as the server's. The inner
// optimizer is the workers', so the server's own optimizer flags are refused with DiLoCo, and
// the outer ones without it.
absl::Status DilocoFromFlags(bool diloco, ServerOptions& o) {
  constexpr const char* kOuter[] = {"sync_every", "outer_optimizer", "outer_lr", "outer_momentum"};
  constexpr const char* kInner[] = {"optimizer", "lr",   "momentum", "nesterov",
                                    "beta1",     "beta2", "eps",     "weight_decay"};
  if (!diloco) {
    for (const char* name : kOuter) {
      if (OffDefault(name)) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " is for --mode=diloco (or diloco-async), not --mode=",
                                                       ModeName(o.mode)));
      }
    }
    return absl::OkStatus();
  }
  for (const char* name : kInner) {
    if (OffDefault(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " with --mode=diloco: the server's optimizer is the outer one (--outer_optimizer, "
          "--outer_lr, --outer_momentum); each worker brings its inner one (summa-worker --inner_optimizer, "
          "or the Python loop's torch optimizer)"));
    }
  }
  o.sync_every = absl::GetFlag(FLAGS_sync_every);
  // An outer step is H local steps of every worker: checkpoint each, unless told otherwise.
  if (!OffDefault("checkpoint_every")) o.checkpoint_every = 1;
  if (o.sync_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--sync_every=", o.sync_every, " must be at least 1"));
  }
  const std::string outer = absl::GetFlag(FLAGS_outer_optimizer);
  if (outer != "nesterov" && outer != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat("unknown --outer_optimizer '", outer, "': use nesterov or sgd"));
  }
  OptimizerOptions& opt = o.optimizer;
  opt.name = "sgd";
  opt.learning_rate = absl::GetFlag(FLAGS_outer_lr);
  opt.momentum = absl::GetFlag(FLAGS_outer_momentum);
  opt.nesterov = outer == "nesterov";
  if (opt.nesterov && opt.momentum == 0) {
    return absl::InvalidArgumentError("--outer_optimizer=nesterov needs --outer_momentum > 0 (or use sgd)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  absl::StatusOr<std::pair<int, int>> workers = ParseWorkers(absl::GetFlag(FLAGS_workers));
  if (!workers.ok()) return workers.status();
  o.min_workers = workers->first;
  o.world_size = workers->second;
  absl::StatusOr<std::pair<Mode, bool>> mode = ParseJobMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return mode.status();
  o.mode = mode->first;
  const bool diloco = mode->second;
  o.staleness = absl::GetFlag(FLAGS_staleness);
  o.backup_workers = absl::GetFlag(FLAGS_backup_workers);
  absl::StatusOr<OnWorkerLoss> loss = ParseOnWorkerLoss(absl::GetFlag(FLAGS_on_worker_loss));
  if (!loss.ok()) return loss.status();
  o.on_worker_loss = *loss;
  absl::StatusOr<NonFinite> nonfinite = ParseNonFinite(absl::GetFlag(FLAGS_nonfinite));
  if (!nonfinite.ok()) return nonfinite.status();
  o.nonfinite = *nonfinite;
  o.deterministic = absl::GetFlag(FLAGS_deterministic);
  absl::StatusOr<WireDType> wire = ParseWireDType(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire.ok()) return wire.status();
  o.wire_dtype = *wire;
  absl::StatusOr<Compression> compression = ParseCompression(absl::GetFlag(FLAGS_compress));
  if (!compression.ok()) return compression.status();
  o.compression = *compression;
  OptimizerOptions& opt = o.optimizer;
  opt.name = absl::GetFlag(FLAGS_optimizer);
  opt.learning_rate = absl::GetFlag(FLAGS_lr);
  opt.momentum = absl::GetFlag(FLAGS_momentum);
  opt.nesterov = absl::GetFlag(FLAGS_nesterov);
  opt.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  opt.beta1 = absl::GetFlag(FLAGS_beta1);
  opt.beta2 = absl::GetFlag(FLAGS_beta2);
  opt.eps = absl::GetFlag(FLAGS_eps);
  absl::StatusOr<LrSchedule> schedule = ParseLrSchedule(absl::GetFlag(FLAGS_lr_schedule));
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
    absl::StatusOr<int> ordinal = o.shards > 1 ? ShardFromHostname(std::getenv("HOSTNAME")) : 0;
    if (!ordinal.ok()) return ordinal.status();
    o.shard = *ordinal;
  }
  o.barrier_deadline = absl::GetFlag(FLAGS_barrier_deadline);
  o.lease = absl::GetFlag(FLAGS_lease);
  o.rejoin_deadline = absl::GetFlag(FLAGS_rejoin_deadline);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (absl::Status s = DilocoFromFlags(diloco, o); !s.ok()) return s;
  o.export_dir = absl::GetFlag(FLAGS_export_dir);
  o.export_path = absl::GetFlag(FLAGS_export);
  o.init_from = absl::GetFlag(FLAGS_init_from);
  o.require_sessions = absl::GetFlag(FLAGS_require_sessions);
  LimitOptions& l = o.limits;
  const struct {
    int64_t* field;
    const char* name;
    std::string text;
  } sizes[] = {
      {&l.max_message_bytes, "max_message_bytes", absl::GetFlag(FLAGS_max_message_bytes)},
      {&l.max_model_bytes, "max_model_bytes", absl::GetFlag(FLAGS_max_model_bytes)},
      {&l.max_table_bytes, "max_table_bytes", absl::GetFlag(FLAGS_max_table_bytes)},
      {&l.max_allreduce_bytes, "max_allreduce_bytes", absl::GetFlag(FLAGS_max_allreduce_bytes)},
      {&l.max_bytes_in_flight_per_peer, "max_bytes_in_flight_per_peer",
       absl::GetFlag(FLAGS_max_bytes_in_flight_per_peer)},
  };
  for (const auto& size : sizes) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(size.text);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--",
                                                                    size.name, ": ", bytes.status().message()));
    *size.field = *bytes;
  }
  l.max_parked_calls = absl::GetFlag(FLAGS_max_parked_calls);
  l.max_parked_calls_per_peer = absl::GetFlag(FLAGS_max_parked_calls_per_peer);
  l.max_collectives = absl::GetFlag(FLAGS_max_collectives);
  l.max_open_collectives_per_peer = absl::GetFlag(FLAGS_max_open_collectives_per_peer);
  l.join_rate = absl::GetFlag(FLAGS_join_rate);
  l.max_data_plane_connections = absl::GetFlag(FLAGS_max_data_plane_connections);
  l.max_data_plane_connections_in_hello = absl::GetFlag(FLAGS_max_data_plane_connections_in_hello);
  l.max_data_plane_connections_in_hello_per_source =
      absl::GetFlag(FLAGS_max_data_plane_connections_in_hello_per_source);
  l.data_plane_hello_timeout = absl::GetFlag(FLAGS_data_plane_hello_timeout);
  if (absl::Status valid = ValidateOptions(o); !valid.ok()) return valid;
  return o;
}

absl::StatusOr<EndpointSecurity> SecurityFromFlags() {
  EndpointSecurity s;
  s.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
  if (absl::Status valid = ValidateTls(s.tls, /*server=*/true); !valid.ok()) return valid;
  const TokenFiles files = TokenFilesFromFlags();
  if (files.status_needs_token && files.worker.empty() && files.admin.empty()) {
    return absl::InvalidArgumentError("--status_needs_token needs --token_file or --admin_token_file");
  }
  if (files.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_grace_period must be 0 or more, got ",
                                                   absl::FormatDuration(files.grace)));
  }
  if (absl::Status m = CheckMetricsAddress(absl::GetFlag(FLAGS_metrics_address), s.tls); !m.ok()) {
    return m;
  }
  absl::StatusOr<TokenCheck> tokens = TokenCheck::Load(files);
  if (!tokens.ok()) return tokens.status();
  s.tokens = *std::move(tokens);
  return s;
}

TokenFiles TokenFilesFromFlags() {
  TokenFiles files;
  files.worker = absl::GetFlag(FLAGS_token_file);
  files.admin = absl::GetFlag(FLAGS_admin_token_file);
  files.grace = absl::GetFlag(FLAGS_token_grace_period);
  files.status_needs_token = absl::GetFlag(FLAGS_status_needs_token);
  return files;
}

absl::StatusOr<Coordinator> CoordinatorFromFlags() {
  Coordinator c;
  c.address = absl::GetFlag(FLAGS_coordinator);
  if (c.address.empty()) return c;
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), ca = absl::GetFlag(FLAGS_tls_ca);
  if (!cert.empty()) c.security.tls = {cert, absl::GetFlag(FLAGS_tls_key), ca.empty() ? cert : ca};
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    // Read again when it changes, as shard 0 reads its own: a rotation reaches both.
    absl::StatusOr<ClientToken> t = ClientToken::FromFile(absl::GetFlag(FLAGS_token_file), ReadUnscopedToken);
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("--coordinator: ", t.status().message()));
    c.security.token = *std::move(t);
  }
  return c;
}

}  // namespace summa::server
