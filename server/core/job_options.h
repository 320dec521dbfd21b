// The job a summa-server runs: its options, and the one home of the names of its modes and
// policies (flags, status, logs) and of their proto conversions. Plain values; thread-safe.
#ifndef SUMMA_SERVER_CORE_JOB_OPTIONS_H_
#define SUMMA_SERVER_CORE_JOB_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/compression.h"
#include "common/trace.h"
#include "server/core/limits.h"
#include "common/optimizer.h"
#include "summa/v1/summa.pb.h"

namespace summa::server {

enum class Mode { kSync, kAsync, kSsp };
enum class OnWorkerLoss { kWait, kShrink };
// What a push holding NaN or infinity does: refused (INVALID_ARGUMENT, nothing changes), accepted
// but its step applies no update, or accepted with the bad values taken as zero.
enum class NonFinite { kReject, kSkipStep, kZero };

const char* ModeName(Mode mode);
const char* OnWorkerLossName(OnWorkerLoss policy);
const char* NonFiniteName(NonFinite policy);
// INVALID_ARGUMENT naming the choices for anything else.
absl::StatusOr<Mode> ParseMode(absl::string_view name);
// --mode as summa-server takes it: sync, async, ssp, or diloco (DiLoCo with sync outer steps) or
// diloco-async; the consistency mode and whether it is DiLoCo. INVALID_ARGUMENT naming the choices.
absl::StatusOr<std::pair<Mode, bool>> ParseJobMode(absl::string_view name);
absl::StatusOr<OnWorkerLoss> ParseOnWorkerLoss(absl::string_view name);
absl::StatusOr<NonFinite> ParseNonFinite(absl::string_view name);
summa::v1::Mode ModeToProto(Mode mode);
// INVALID_ARGUMENT for MODE_UNSPECIFIED or an unknown value.
absl::StatusOr<Mode> ModeFromProto(summa::v1::Mode mode);

// What --mode=diloco starts from unless told otherwise: the paper's H and outer optimizer
// (Nesterov SGD), the one home of these defaults (summa-server's flags take them from here).
struct DilocoDefaults {
  int sync_every = 500;
  const char* outer_optimizer = "nesterov";
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
};

struct ServerOptions {
  // The most ranks the job holds (--workers=MIN:MAX's MAX, or N).
  int world_size = 1;
  // The group the job starts with, ranks 0..min_workers-1 (MIN); 0 or world_size: a job that
  // cannot grow. Others join a running job, each from the next step boundary (sync).
  int min_workers = 0;
  Mode mode = Mode::kSync;
  int staleness = 2;  // ssp: how many steps a worker may run ahead of the slowest
  OptimizerOptions optimizer;
  NonFinite nonfinite = NonFinite::kReject;
  // Sync only: backup workers (Chen et al., "Revisiting Distributed Synchronous SGD", 2016). With
  // B > 0 a partition completes a step once the first (group size - B) ranks of the step's group
  // have pushed it (at least one); a rank whose push of the step comes after that is late for
  // the partition: its push is dropped (not summed, counted per rank), and a push-pull of it is
  // answered with the partition's newest weights, from which the worker goes on. 0: every rank
  // of the group is waited for. At most MIN - 1 (--workers=MIN:MAX).
  int backup_workers = 0;
  // DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
  // Models", 2023): 0, or H, the local steps each worker takes with its own inner optimizer
  // between exchanges. With H > 0 a push is a pseudo-gradient (the weights the worker last pulled
  // less its weights after its H steps, times the examples they covered), a step is an outer
  // step, and `optimizer` is the outer optimizer (the paper's: Nesterov SGD, lr 0.7, momentum
  // 0.9). In sync mode (--mode=diloco) a step averages the group's pseudo-gradients weighted by
  // their examples; in async mode (--mode=diloco-async) each is applied as it arrives, as its
  // share of a whole group's: divided by its examples times the group's size.
  int sync_every = 0;
  // Sync only: each step's pushes are summed in rank order, whatever order they arrive in, so the
  // weights are the same bits on every run of the same job (server/core/aggregator.h).
  bool deterministic = false;
  // The wire format the server asks of its workers at Join (common/compression.h): the dtype of
  // pushes and pulls, and top-k for pushes. It takes any of them from any client, and always
  // sums and keeps the weights in float32.
  WireDType wire_dtype = WireDType::kFloat32;
  Compression compression;
  int64_t partition_bytes = 4 << 20;
  // This server is shard `shard` of `shards`: it holds the partitions common/partition_map.h's
  // AssignShards gives it and refuses the others (a worker talks to every shard).
  int shard = 0;
  int shards = 1;
  // A shard other than 0 that follows shard 0's membership view (summa-server --coordinator):
  // its own lapsed leases drop no one and end nothing (server/rpc/coordination.h).
  bool follower = false;
  // How long a pull may wait for its step, counted from the pull's arrival.
  absl::Duration barrier_deadline = absl::Minutes(10);
  // A member that makes no call for this long has lapsed.
  absl::Duration lease = absl::Seconds(10);
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kWait;
  // wait: how long a lapsed member may take to rejoin before the job ends.
  absl::Duration rejoin_deadline = absl::Minutes(5);
  // Refuse a member's call that carries no session (true), or take it as the rank's (false: for
  // clients from before sessions; a call with a fenced session is refused either way).
  bool require_sessions = true;
  // The job's checkpoint directory (--checkpoint_dir); empty: no checkpoints. A shard keeps its
  // own in its subdirectory shard-I-of-K (server/checkpoint/checkpoint_dir.h's
  // ShardCheckpointDir), so that shards may share one, and a job restarted with another shard
  // count finds every old shard's there.
  std::string checkpoint_dir;
  // Steps between checkpoints; 0: only at shutdown. In a sharded sync job the checkpoints are of
  // the versions that are multiples of it, each partition copied as it reaches that version, so
  // that shards (which step together) keep checkpoints of the same versions.
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 2;  // the newest this many are kept
  // Weights in and out as safetensors (common/safetensors.h). export_dir: where the Export call
  // writes (--export_dir; empty: checkpoint_dir). export_path: the file the final weights go to
  // as the daemon shuts down (--export; empty: none). init_from: the file the model's initial
  // values come from (--init_from; empty: the first joiner's); a checkpoint restored at start
  // takes precedence.
  std::string export_dir;
  std::string export_path;
  std::string init_from;
  // Called with each step's duration (partition 0, under its lock: keep it cheap), or null.
  std::function<void(absl::Duration)> step_observer;
  const Clock* clock = Clock::Real();  // Not owned.
  // Records the data path's stages (sum, optimizer, wait) per partition when not null. Not owned.
  Tracer* tracer = nullptr;
  // What the server holds for its callers, at most (server/core/limits.h).
  LimitOptions limits;
};

// A StatefulSet pod's ordinal, the number after the last '-' of its hostname (summa-server-1: 1),
// for --shard's default; INVALID_ARGUMENT naming the hostname when it has none.
absl::StatusOr<int> ShardFromHostname(const char* hostname);

// --workers: "N" (N:N) or "MIN:MAX" (torchrun's spelling); {MIN, MAX}, or INVALID_ARGUMENT
// naming the value.
absl::StatusOr<std::pair<int, int>> ParseWorkers(absl::string_view text);

absl::Status ValidateOptions(const ServerOptions& options);

// The job's mode as --mode spells it: "sync", "diloco", "diloco-async"... (`sync_every`: DiLoCo's
// H, 0 for a job of gradients).
std::string JobModeName(Mode mode, int sync_every);
std::string JobModeName(const ServerOptions& options);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_JOB_OPTIONS_H_
