// ParameterServer: the daemon's core, free of gRPC. It learns the model from the first Join that
// carries values (or from a checkpoint), holds the partitions (server/core/partition.h) and hands
// each push to the job's consistency policy (server/core/consistency.h); membership and leases live
// in server/core/membership.h, the optimizer in common/optimizer.h, checkpoint encoding in
// server/core/checkpoint_codec.h. Pulls that cannot be answered yet are parked and answered when their
// step completes, or at their deadline.
//
// A push takes its partition's lock and nothing else: the model is published once through an
// atomic pointer, membership is read through atomics, counters are atomics. Lock order: a
// checkpoint takes every partition lock in id order; nothing takes two otherwise. Thread-safe.
#ifndef SUMMA_SERVER_CORE_PARAMETER_SERVER_H_
#define SUMMA_SERVER_CORE_PARAMETER_SERVER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/consistency.h"
#include "server/core/embedding_table.h"
#include "server/core/job_options.h"
#include "server/core/membership.h"
#include "common/optimizer.h"
#include "server/core/model_export.h"
#include "server/core/parked_call.h"
#include "server/core/partition.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

// A tensor as a Join carries it: its description, and its values or nothing.
struct JoinTensor {
  TensorSpec spec;
  absl::string_view data;  // raw little-endian float32, or empty
};

struct JoinRequestView {
  int rank = -1;  // -1: assign the lowest rank not yet joined
  int world_size = 0;
  std::vector<JoinTensor> params;
  std::string peer;
  std::string status_address;
  // The params carry no values; this joiner sends them through Initialize when asked.
  bool values_follow = false;
  // It takes a DiLoCo job's local steps and pushes pseudo-gradients (JoinRequest).
  bool takes_local_steps = false;
  // The job's embedding tables (JoinRequest.tables): the defining Join declares them, a later
  // one repeats them or declares none.
  std::vector<summa::v1::EmbeddingTableSpec> tables;
};

// A pull of some rows of one embedding table (SparsePullRequest), ids parsed.
struct SparsePullView {
  int rank = 0;
  uint64_t session = 0;
  uint32_t table = 0;
  uint64_t min_version = 0;
  std::vector<uint64_t> ids;
};

// Row gradients of one step for one table (SparsePushRequest); views valid while the call runs.
struct SparsePushView {
  int rank = 0;
  uint64_t session = 0;
  uint32_t table = 0;
  uint64_t step = 0;
  int64_t num_examples = 0;
  absl::Span<const uint64_t> ids;
  absl::Span<const float> grads;
};

struct InitializeView {
  int rank = 0;
  uint32_t partition = 0;
  bool dtype_is_float32 = true;
  absl::string_view data;
  uint64_t session = 0;
};

struct JoinResult {
  int rank = 0;
  uint64_t session = 0;  // what this member's later calls carry
  uint64_t version = 0;
  // The step this rank pushes next: the version in sync mode, the rank's own count otherwise.
  uint64_t next_step = 0;
  std::vector<PartitionRange> partitions;
  std::vector<int> live_ranks;
  // Some partitions have no initial values yet: this joiner (values_follow) must send them.
  bool initialize = false;
  // Sync mode, one shard of several: the versions of the checkpoints it keeps, ascending (what
  // RollBack can go back to).
  std::vector<uint64_t> checkpoint_versions;
  uint64_t view = 0;  // the membership view, for the joiner's push stamps
  // The state is a checkpoint's (Restore, RollBack) and no step has completed since.
  bool restored = false;
};

struct CheckpointInfo {
  std::string path;
  uint64_t version = 0;
  absl::Time written = absl::InfinitePast();
};

struct StatusSnapshot {
  uint64_t version = 0;
  bool model_defined = false;
  int partitions_pending = 0;  // without initial values yet
  std::vector<TensorSpec> params;
  int64_t parameter_count = 0;
  int partition_count = 0;
  std::vector<MemberInfo> members;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t pushes_served = 0;
  uint64_t pulls_served = 0;
  uint64_t duplicate_pushes = 0;
  uint64_t nonfinite_pushes = 0;
  uint64_t stale_view_pushes = 0;  // refused for a stale membership view
  double learning_rate = 0;  // the schedule's rate for the next update of partition 0
  absl::Duration last_step = absl::ZeroDuration();
  absl::Duration uptime;
  std::string optimizer;
  CheckpointInfo checkpoint;
  std::string job_error;  // why the job ended, when it did
  uint64_t rollbacks = 0;
  uint64_t last_rollback_version = 0;
  int64_t partition_bytes_held = 0;  // this server's partitions' bytes
  uint64_t view = 0;                 // the membership view (server/core/membership.h)
  std::vector<GroupChange> group_log;  // oldest first (ParameterServer::GroupLog)
  uint64_t steps_restarted = 0;        // sync: steps started again under a new group
  uint64_t examples_applied = 0;       // sync: examples of the completed steps, summed
  // Sync with backup workers (--backup_workers; empty without): per rank, over this server's
  // partitions, its late pushes and timed pushes and delays summed, and its last delay and steps
  // behind the largest of any partition's; late_pushes, every rank's summed.
  std::vector<RankLateness> lateness;
  uint64_t late_pushes = 0;
  // The embedding tables' rows held here, in declaration order, and the bytes of all of them
  // against --max_table_bytes (0: no bound).
  std::vector<TableCounters> tables;
  int64_t table_bytes = 0;
  int64_t max_table_bytes = 0;
};

class ParameterServer {
 public:
  // `options` must pass ValidateOptions.
  explicit ParameterServer(ServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Takes the model, weights, optimizer state and versions from a checkpoint's header and its
  // partitions, read one at a time into the model as it is built, and its embedding tables (the
  // header declares them) with their state and rows, read a chunk at a time; before any Join.
  // Changes nothing unless it succeeds. FAILED_PRECONDITION naming both sides when the
  // checkpoint's job differs from the options; DATA_LOSS when its partitions or tables' records
  // are torn, corrupt or do not tile its model (checkpoint_codec.h's DecodeTables);
  // RESOURCE_EXHAUSTED when the rows pass --max_table_bytes.
  absl::Status Restore(const summa::v1::Checkpoint& header, PartitionSource& partitions);

  // One shard's checkpoint as a restore reads it. Not owned.
  struct ShardCheckpoint {
    const summa::v1::Checkpoint* header;
    PartitionSource* partitions;
  };
  // As Restore, from the checkpoints of one version that the job's K shards wrote when it ran with
  // another shard count (`set[i]`: shard i's of K): this shard takes the partitions it holds now
  // (AssignShards over options().shards) from whichever of them holds each, reads no file that
  // holds none of them (but for its tables' records, when the job has tables), and takes the
  // group from shard 0's (the one that coordinated it). Each table keeps the rows of every file
  // that are this shard's now (RowShard over options().shards) and the ids waiting for admission
  // likewise; its version, updates and ranks' next steps are shard 0's in sync mode (every shard's
  // table is at the set's version), the most of any shard's in async and ssp (no push applied
  // twice); its counters (rows created and expired, gradients dropped) are the sums of the old
  // shards i with i % options().shards == options().shard, so that the job's totals stay.
  // FAILED_PRECONDITION when the set is not K shards' of one version and one model, naming what
  // differs, or their job differs from the options in more than the shard count (the partitions'
  // size included: a checkpoint's partitions are the ones a restore deals out).
  absl::Status RestoreResharded(absl::Span<const ShardCheckpoint> set);

  // The model's initial values come from `weights` (before any Join, and not after a restore):
  // the Join that defines the model must describe the same tensors in the same order, or is
  // refused with FAILED_PRECONDITION naming the first that differs, and the model takes these
  // values instead of the joiner's (a joiner that sends none, values_follow or not, defines it
  // too). FAILED_PRECONDITION once the model is defined.
  absl::Status StartFrom(InitialWeights weights);

  // Admits (or readmits) a member. INVALID_ARGUMENT for a wrong world size, a rank outside the
  // group or a bad tensor; FAILED_PRECONDITION when the model differs from the server's or the
  // rank was dropped; UNAVAILABLE when no one has supplied initial values yet (retry). A join
  // with `values_follow` defines the model without values (when there is none) and is asked to
  // send them (`initialize`) while any partition lacks them.
  absl::StatusOr<JoinResult> Join(const JoinRequestView& request);

  // One partition's initial values from a member; true when they were taken, false when the
  // partition already had values (nothing changes). INVALID_ARGUMENT for a bad partition, dtype
  // or length, NOT_FOUND for a caller that is not a member, FAILED_PRECONDITION with no model.
  absl::StatusOr<bool> Initialize(const InitializeView& request);

  // Every call of a member carries the session its Join returned; one from an older session of
  // the rank (a process a newer Join fenced) or none is refused with FAILED_PRECONDITION.

  // Renews `rank`'s lease. NOT_FOUND when it is not a member, FAILED_PRECONDITION when dropped.
  absl::Status Heartbeat(int rank, uint64_t session);

  // Takes `rank` out of the group for good; the steps go on without it.
  absl::Status Leave(int rank, uint64_t session);

  // Hands a gradient for one partition of one step to the consistency policy; true when it
  // completed the step (sync) or was applied. Every refusal changes nothing: INVALID_ARGUMENT
  // (rank, partition, dtype, length, example count, a non-finite value under --nonfinite=reject),
  // NOT_FOUND (not a member: Join again), FAILED_PRECONDITION (no model, step already finished,
  // rank dropped), OUT_OF_RANGE (step in the future), ALREADY_EXISTS (this rank already pushed
  // this partition for this step: a retry, never summed twice), ABORTED (the job has ended).
  absl::StatusOr<bool> Push(const PushRequestView& request);

  // Answers `call` with the partition's weights once its version is >= min_version; parks it
  // until then (up to the barrier deadline). Errors finish the call at once. rank -1: an
  // operator's pull, not a member's (no session).
  void Pull(int rank, uint64_t session, uint32_t partition, uint64_t min_version,
            std::shared_ptr<ParkedCall> call);

  // Push, then answer with the partition's next weights: version step + 1 in sync mode (a
  // retried push that was already counted, even after its step completed, only pulls), the
  // newest in async mode, and the newest once the slowest member is within `staleness` steps in
  // ssp mode.
  void PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call);

  // Embedding tables (server/core/embedding_table.h). SparsePull answers `call` with the rows of
  // `ids` of table `table` once it is at min_version or later (parked until then, up to the
  // barrier deadline); SparsePush hands a step's row gradients to the table: true when they
  // completed its step (sync) or were applied. Both refuse, changing nothing: INVALID_ARGUMENT
  // for an unknown table (naming the tables declared), an id past the table's num_embeddings or
  // another shard's, a length unlike the table's dimension, an answer past --max_message_bytes,
  // an example count outside [0, kMaxTableExamples], a non-finite gradient under
  // --nonfinite=reject (skip_step: the table's step applies no update; zero: taken as 0); the
  // membership's refusals as Push's; and the table's own (EmbeddingTable::Pull, Push).
  void SparsePull(SparsePullView request, std::shared_ptr<ParkedCall> call);
  absl::StatusOr<bool> SparsePush(const SparsePushView& request);
  // The most examples one sparse push may count (their sum over a step stays far from overflow).
  static constexpr int64_t kMaxTableExamples = int64_t{1} << 40;
  // The table of index `table` of the model, or INVALID_ARGUMENT naming the tables declared.
  absl::StatusOr<EmbeddingTable*> Table(uint32_t table) const;

  // Lapses expired leases (dropping them under `shrink`, ending the job under `wait` once the
  // rejoin deadline passes) and finishes parked pulls past their deadline with
  // DEADLINE_EXCEEDED, naming what the step still waits for.
  void Tick(absl::Time now);

  // Sync mode: restores this server's checkpoint of `to_version` in place of the live model, if
  // the server is still at `from_version`, so that shards agree again after one of them was
  // restored from an older checkpoint. Every member must then join again (its calls get
  // NOT_FOUND), parked calls are failed alike, and checkpoints newer than `to_version` are
  // removed (a history the job abandoned). True when it rolled back; false when the server was
  // at `to_version` already. FAILED_PRECONDITION outside sync mode, without checkpoints, or with
  // no checkpoint of that version (naming those kept); NOT_FOUND when the caller is not a member
  // (Join again); ABORTED when the server is at neither version; DATA_LOSS for a torn file.
  // Blocks on disk I/O.
  absl::StatusOr<bool> RollBack(int rank, uint64_t session, uint64_t to_version, uint64_t from_version);

  // Called (with a partition lock held: keep it cheap, never call back in) when every partition
  // holds its copy of a version due for a checkpoint (sync shards), so that the caller runs
  // MaybeCheckpoint soon. Register before use.
  void OnCheckpointDue(std::function<void()> due) { checkpoint_due_ = std::move(due); }

  // Writes a checkpoint when one is due (every `checkpoint_every` steps: in a sharded sync job
  // the copies every partition took at the newest multiple of it), or at once when `force`:
  // the partitions, then every embedding table's state and rows in chunks (each table's lock
  // held while its rows are written). FAILED_PRECONDITION in sync mode while partitions are
  // between versions, or a table is not at their version (retry; parameter_server_checkpoint.cc
  // says why and what a sharded job does).
  // Blocks on disk I/O: call it from a thread of the daemon's, never from a gRPC callback.
  absl::Status MaybeCheckpoint(bool force);

  // Writes the master weights, of one moment, as a safetensors file `file_name` in `dir` (both
  // the operator's: the edge checks a caller's name with CheckExportName first; empty:
  // DefaultExportName). In sync mode every partition is at one version (all partition locks
  // held while copied, as a checkpoint takes them); in async and ssp mode it is one moment, and
  // the version is the lowest. FAILED_PRECONDITION without a model or its values, or on a shard
  // of several (naming summa-checkpoint export); UNAVAILABLE while partitions are between
  // versions (retry); INTERNAL when the file cannot be written. Blocks on disk I/O.
  absl::StatusOr<ExportedModel> Export(const std::string& dir, const std::string& file_name);
  // Export's directory: --export_dir, or the checkpoint directory; empty: none.
  const std::string& export_dir() const {
    return options_.export_dir.empty() ? options_.checkpoint_dir : options_.export_dir;
  }

  // Fails every parked call with UNAVAILABLE: the server is going down.
  void Shutdown();

  std::string job_error() const { return membership_.job_error(); }
  // The ranks still in the group (not dropped, not left), ascending: the workers re-shard the
  // data over these.
  std::vector<int> LiveRanks() const { return membership_.LiveRanks(); }
  // The membership view (Membership::view): pushes stamped with another one are refused.
  uint64_t view() const { return membership_.view(); }
  Membership& membership() { return membership_; }
  const Membership& membership() const { return membership_; }

  // The lowest partition version (0 before the model is defined): what Status reports as the
  // version, without the rest of a status (a heartbeat's answer).
  uint64_t version() const;
  StatusSnapshot Status() const;
  // The group of each stretch of steps, oldest first (the last 64 changes): which ranks split
  // each step's batch. Kept in checkpoints.
  std::vector<GroupChange> GroupLog() const;
  // The data path's totals (pushes and bytes in, replies and bytes out) in a snapshot with only
  // those fields set: no clock, no membership, so the daemon may log them as it shuts down.
  StatusSnapshot Traffic() const;

  const ServerOptions& options() const { return options_; }

 private:
  friend class ParameterServerPeer;  // tests/parameter_server_peer.h: reads the weights
  // Immutable once published, apart from the partitions' own locked state.
  struct Model {
    explicit Model(PartitionMap m) : map(std::move(m)) {}
    PartitionMap map;
    // This shard's partitions (every one without shards), in id order.
    std::vector<std::unique_ptr<Partition>> partitions;
    // Per partition id: its index in `partitions`, or -1 for another shard's.
    std::vector<int> index_of;
    // Partitions still without initial values (a model defined by a values_follow join); pushes
    // and pulls are refused until none is left.
    mutable std::atomic<int> pending{0};
    // Sync checkpoints: partitions' copies taken (Freeze), counted to tell when all hold one.
    mutable std::atomic<uint64_t> frozen{0};
    // The job's embedding tables, in declaration order, each with this shard's rows.
    std::vector<std::unique_ptr<EmbeddingTable>> tables;
  };

  const Model* model() const { return model_.load(std::memory_order_acquire); }
  // How long a parked call may wait: --barrier_deadline, per local step of a DiLoCo exchange (a
  // step there is H local steps of the slowest member).
  absl::Duration BarrierDeadline() const { return options_.barrier_deadline * std::max(1, options_.sync_every); }
  // The model a checkpoint holds, unpublished, and its lowest version: this shard's own (one
  // checkpoint) or, `resharded`, a whole set of another shard count's (RestoreResharded).
  // DATA_LOSS when partitions are torn, corrupt or do not tile the model.
  absl::StatusOr<std::pair<std::unique_ptr<Model>, uint64_t>> ModelFrom(absl::Span<const ShardCheckpoint> pieces,
                                                                        bool resharded) const;
  // Resharded: old shard `from`'s state of a table merged into `into`, its state as read so far
  // (RestoreResharded says how).
  void MergeTableState(int from, const TableState& state, TableState& into) const;
  // Publishes a restored model and the group of `header`, and marks the server restored.
  absl::Status Adopt(std::pair<std::unique_ptr<Model>, uint64_t> restored, const summa::v1::Checkpoint& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(define_mu_);
  // Every partition at one moment: all their locks held (in id order) while `take(low, high)`,
  // over their versions (`frozen`: their frozen copies'), says whether to copy them, and while
  // they are copied (the weights alone when `weights_only`). Empty copies when it said no.
  struct MomentCopy {
    uint64_t low = UINT64_MAX;
    uint64_t high = 0;
    std::vector<PartitionSnapshot> copies;  // in id order
  };
  MomentCopy CopyAtOneMoment(const Model& model, bool frozen, bool weights_only,
                             absl::FunctionRef<bool(uint64_t low, uint64_t high)> take) const;
  // The first Join's model against --init_from's: FAILED_PRECONDITION naming the first difference.
  absl::Status CheckInitialModel(const InitialWeights& initial, const JoinRequestView& request) const;
  // Sync checkpoints: copies `p` for the checkpoint writer when it just reached a multiple of
  // --checkpoint_every, and tells checkpoint_due_ once every partition has.
  void MaybeFreeze(const Model& model, Partition& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Sync shards with checkpoints: partitions freeze, and checkpoints are of those copies.
  bool FreezesForCheckpoints() const {
    return options_.mode == Mode::kSync && options_.shards > 1 && options_.checkpoint_every > 0 &&
           !options_.checkpoint_dir.empty();
  }
  // Refuses a call on a partition whose model a rollback replaced; Answerable() otherwise.
  absl::Status Gone(const Partition& p) const ABSL_SHARED_LOCKS_REQUIRED(p.mu);
  // `flat` holds every initial value, or is empty: the values follow through Initialize (or a
  // restore), and the partitions are pending until then.
  absl::StatusOr<std::unique_ptr<Model>> NewModel(std::vector<TensorSpec> specs,
                                                  const std::vector<float>& flat,
                                                  const std::vector<summa::v1::EmbeddingTableSpec>& tables = {}) const;
  void PublishModel(std::unique_ptr<Model> model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(define_mu_);
  // The model, once it has every initial value; FAILED_PRECONDITION otherwise.
  absl::StatusOr<const Model*> ReadyModel() const;
  absl::Status DefineModel(const JoinRequestView& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(define_mu_);
  absl::Status CheckSameModel(const Model& model, const JoinRequestView& request) const;
  // Partition `id` of this shard, or INVALID_ARGUMENT naming why not (no such partition, or
  // another shard's).
  absl::StatusOr<Partition*> Find(const Model& model, uint32_t id) const;
  // The partition that float32 `data` (`what`: "initial values") is meant for, or
  // INVALID_ARGUMENT: an unknown partition, another dtype, a length unlike the partition's.
  absl::StatusOr<Partition*> PartitionFor(const Model& model, uint32_t partition, bool float32,
                                                 absl::string_view data, const char* what);
  // A push's values as float32: its own bytes when it sent the whole partition in float32,
  // otherwise decoded (another dtype, or sparse) into this thread's buffer, valid until the
  // thread's next push. INVALID_ARGUMENT for an unknown dtype or bytes unlike the partition's.
  static absl::StatusOr<absl::Span<const float>> PushedGradient(const Partition& p, const PushRequestView& r);
  // Checks a push's values under --nonfinite; how to take them, or the refusal.
  absl::StatusOr<PushValues> CheckValues(const PushRequestView& request, absl::Span<const float> values);
  void PullFrom(const Model& model, uint32_t partition, uint64_t min_version,
                std::shared_ptr<ParkedCall> call);
  // Membership changed: members left out complete steps; a job that ended aborts parked calls.
  void OnMembershipChange();
  void FailParked(const absl::Status& status);
  absl::Status Answerable() const;
  JobDescription Job() const;
  void CountAnswers(const CallsToFinish& answered, int64_t floats);
  // Membership::Admit, choosing the step a joiner of a running elastic job takes part from.
  absl::StatusOr<Admitted> Admit(const Model& model, const JoinRequestView& request);
  // Writes the group log again from `step` on, as the membership now has it (the changes of its
  // ranks only).
  void LogGroupsFrom(uint64_t step);

  const ServerOptions options_;
  // This shard's own checkpoints: ShardCheckpointDir of options_.checkpoint_dir; empty without.
  const std::string checkpoint_dir_;
  const std::unique_ptr<const Optimizer> optimizer_;
  Membership membership_;
  const std::unique_ptr<const ConsistencyPolicy> policy_;
  const absl::Time started_;

  // What the tables of every model (a rolled-back one's too, while it lives) hold: declared
  // before the models, so that it outlives them.
  TableMemory table_memory_;
  absl::Mutex define_mu_;  // serializes defining the model
  std::unique_ptr<Model> model_owner_ ABSL_GUARDED_BY(define_mu_);
  // --init_from's weights until the model is defined (StartFrom).
  std::optional<InitialWeights> initial_ ABSL_GUARDED_BY(define_mu_);
  // Models a rollback replaced: calls that read the pointer before may still hold them. Kept
  // until the server goes (one model's memory per rollback).
  std::vector<std::unique_ptr<Model>> retired_ ABSL_GUARDED_BY(define_mu_);
  std::function<void()> checkpoint_due_;  // fixed before use
  std::atomic<const Model*> model_{nullptr};

  absl::Mutex checkpoint_mu_;  // one checkpoint at a time; taken before any partition lock
  mutable absl::Mutex info_mu_;
  CheckpointInfo checkpoint_ ABSL_GUARDED_BY(info_mu_);
  uint64_t rollbacks_ ABSL_GUARDED_BY(info_mu_) = 0;
  uint64_t last_rollback_version_ ABSL_GUARDED_BY(info_mu_) = 0;
  std::vector<GroupChange> group_log_ ABSL_GUARDED_BY(info_mu_);  // the last 64, oldest first

  std::atomic<bool> shut_down_{false};
  // Restored or rolled back, and no step completed since (JoinResult::restored).
  std::atomic<bool> restored_{false};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::atomic<uint64_t> pushes_served_{0};
  std::atomic<uint64_t> pulls_served_{0};
  std::atomic<uint64_t> duplicate_pushes_{0};
  std::atomic<uint64_t> nonfinite_pushes_{0};
  std::atomic<uint64_t> stale_view_pushes_{0};
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_PARAMETER_SERVER_H_
