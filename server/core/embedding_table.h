// EmbeddingTable: one embedding table's rows on one server shard (the shard's share by
// common/row_hash.h's RowShard), in a hash map keyed by the 64-bit id (ps-lite's key-value
// design), each row with its optimizer state and the step it was last touched at. A row is
// created the first time a pull names it (or the admit_after-th time: admission), its values
// deterministic from the id and the table's seed, so every restart and every shard count agrees
// on it; a row untouched for expire_after steps is dropped (expiry). Both are Monolith's.
//
// Steps: in sync mode a push of step s is summed into the step's pending rows, and the step
// completes (the row-wise optimizer runs on each row a push named, with the sum divided by the
// examples of the step's pushes, and the version moves to s + 1) when every rank of the step's
// group (Membership::GroupAt) has pushed, an empty push included; a rank excluded since leaves
// the step, which completes with the ranks left (a table step does not start again, as a dense
// one does: its pushes so far stay summed). In async and ssp mode each push is applied on
// arrival with its own example count. A pull waits (parked, without a thread) for the table's
// version to reach its min_version, as a dense pull does.
//
// The row-wise optimizer is common/optimizer.h's rule (sgd, adagrad, or adam, whose bias
// correction counts the table's updates: lazy Adam, torch.optim.SparseAdam's semantics) run on
// each touched row alone, so rows a step did not touch keep their values and state: for sgd and
// adagrad exactly what a dense tensor's step does to rows whose gradient is zero.
//
// Memory: rows take row_bytes() each (values, optimizer state, id and step, the index's entry)
// from the shard's TableMemory, which bounds all its tables (summa-server --max_table_bytes);
// a row that would pass it is refused with RESOURCE_EXHAUSTED naming the flag.
//
// Thread-safe: one lock per table, taken by every method; nothing else is called under it but
// the membership's lock-free reads.
#ifndef SUMMA_SERVER_CORE_EMBEDDING_TABLE_H_
#define SUMMA_SERVER_CORE_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/optimizer.h"
#include "server/core/job_options.h"
#include "server/core/membership.h"
#include "server/core/parked_call.h"
#include "server/core/snapshot.h"
#include "summa/v1/summa.pb.h"

namespace summa::server {

// The bytes a shard's tables may hold, shared by all of them. Thread-safe (atomics).
class TableMemory {
 public:
  // `limit` 0: no bound.
  explicit TableMemory(int64_t limit) : limit_(limit) {}
  // Takes `bytes` unless that would pass the limit.
  bool TryTake(int64_t bytes);
  void Give(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

struct TableContext {
  Mode mode = Mode::kSync;
  int shard = 0;
  int shards = 1;
  const Membership* members = nullptr;  // Not owned.
  TableMemory* memory = nullptr;        // Not owned.
};

// What a table's status reports (summa.v1.TableStatus).
struct TableCounters {
  std::string name;
  int dim = 0;
  std::string optimizer;
  uint64_t version = 0;
  int64_t rows = 0;
  int64_t bytes = 0;
  uint64_t rows_created = 0;
  uint64_t rows_expired = 0;
  int64_t rows_waiting_admission = 0;
  uint64_t unadmitted_reads = 0;
  uint64_t dropped_gradients = 0;
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
};

// A table's state as a checkpoint keeps it, and a restore hands it back: the step counters and
// the admission counts whole, and the rows in chunks (TableRows) through a callback.
struct TableState {
  uint64_t version = 0;
  uint64_t updates = 0;  // optimizer updates applied: lazy Adam's bias correction counts them
  uint64_t rows_created = 0;
  uint64_t rows_expired = 0;
  uint64_t dropped_gradients = 0;
  uint64_t rows = 0;  // rows held (Save: what its chunks hold; RestoreState ignores it)
  std::vector<uint64_t> next_steps;  // per rank: the step it pushes next (async and ssp: its count)
  std::vector<uint64_t> waiting_ids;     // admission: ids seen and not admitted yet
  std::vector<uint32_t> waiting_counts;  // and how often each was seen
};

// Some rows of a table: ids[i]'s values are values[i * dim, (i + 1) * dim), its optimizer slot k
// slots[k][i * dim, ...), and it was last touched at step touched[i].
struct TableRows {
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  std::vector<uint64_t> touched;
  void Clear();
};

class EmbeddingTable {
 public:
  // INVALID_ARGUMENT naming the table and the field for a spec that cannot be served: an empty
  // name, a dimension outside [1, 65536], a dtype other than float32, an unknown initializer or
  // optimizer, an out-of-range optimizer option.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const summa::v1::EmbeddingTableSpec& spec,
                                                                TableContext context);
  // The spec as a Join must repeat it: defaults filled in (Normalized).
  static absl::StatusOr<summa::v1::EmbeddingTableSpec> Normalized(summa::v1::EmbeddingTableSpec spec);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const summa::v1::EmbeddingTableSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name(); }
  int dim() const { return dim_; }
  // What one row takes from TableMemory.
  int64_t row_bytes() const { return row_bytes_; }
  const std::vector<std::string>& slot_names() const { return slot_names_; }

  // OK when every id may be asked of this shard: below num_embeddings (when set) and this
  // shard's by RowShard; INVALID_ARGUMENT naming the first that is not.
  absl::Status CheckIds(absl::Span<const uint64_t> ids) const;

  // Answers `call` with the rows of `ids` (checked by CheckIds first), as of a version >=
  // min_version, filled as a Snapshot of ids.size() x dim floats; parks it until then, up to
  // `deadline`. Rows not yet held are created (or, under admission, counted and read as zeros);
  // RESOURCE_EXHAUSTED when one would pass the memory bound. Every answer's status goes in
  // `out`, finished by the caller after the lock.
  void Pull(std::vector<uint64_t> ids, uint64_t min_version, absl::Time deadline,
            std::shared_ptr<ParkedCall> call, CallsToFinish& out);

  // Takes `rank`'s row gradients (`grads`: ids.size() x dim, ids checked by CheckIds, duplicates
  // summed) of `num_examples` examples for `step`. True when it completed the step (sync) or was
  // applied. INVALID_ARGUMENT for a bad length or a negative example count; FAILED_PRECONDITION
  // for a rank outside the step's group; ALREADY_EXISTS for a step this rank pushed already (a
  // retry: never summed twice); OUT_OF_RANGE for a future step (sync). Refusals change nothing.
  // `skip` (a non-finite push under --nonfinite=skip_step): counted, but the step (sync) or the
  // push (async) applies no update.
  absl::StatusOr<bool> Push(int rank, uint64_t step, int64_t num_examples, absl::Span<const uint64_t> ids,
                            absl::Span<const float> grads, CallsToFinish& out, bool skip = false);

  // Sync: completes the step when every rank left in its group has pushed (after an exclusion).
  void OnMembershipChange(CallsToFinish& out);
  // `rank` joins the group from step `from_step`: the step it pushes next (async, ssp: its count
  // so far is kept).
  void OnAdmitted(int rank, uint64_t from_step);
  // Parked pulls whose deadline passed get DEADLINE_EXCEEDED.
  void Expire(absl::Time now, CallsToFinish& out);
  void FailParked(const absl::Status& status, CallsToFinish& out);
  // A rollback replaced the model this table belongs to: its rows and their memory go, its
  // parked pulls and every later call get `gone`.
  void Retire(const absl::Status& gone, CallsToFinish& out);

  uint64_t version() const;
  // The step `rank` pushes next.
  uint64_t NextStep(int rank) const;
  TableCounters Counters() const;

  // Checkpoints: the state, then every row in chunks of at most `chunk_rows`, each handed to
  // `chunk` (which writes it) while the table's lock is held, so that the rows are of one
  // moment (the state's version); a failed chunk stops the walk and is returned.
  absl::Status Save(TableState* state, int64_t chunk_rows,
                    absl::FunctionRef<absl::Status(const TableRows&)> chunk) const;
  // Restore, before any call: the state, then rows chunk by chunk (rows of other shards, by
  // RowShard over this shard count, skipped: a restore into another shard count). Ids waiting
  // for admission past the memory bound are forgotten (their count starts again).
  // INVALID_ARGUMENT for a chunk unlike the table (dimension, slots); RESOURCE_EXHAUSTED past
  // the memory bound.
  void RestoreState(const TableState& state);
  absl::Status RestoreRows(const TableRows& rows);

  // The row of `id` as held now (empty when not held), for tests.
  std::vector<float> RowForTest(uint64_t id) const;
  std::vector<float> SlotForTest(uint64_t id, int slot) const;

 private:
  EmbeddingTable(summa::v1::EmbeddingTableSpec spec, TableContext context, std::unique_ptr<const Optimizer> optimizer);

  // A row's place: values at Values(slot), optimizer slot k at Slot(slot, k). Rows live in chunks
  // of chunk_rows_ rows, each chunk one or more 2 MiB huge pages (madvise): a step touches rows
  // all over a large table, and with 4 KiB pages nearly every row would cost a TLB miss.
  struct FreeChunk {
    void operator()(float* p) const;
  };
  static constexpr int64_t kHugePage = int64_t{2} << 20;
  float* Values(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  float* Slot(uint32_t slot, int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const float* Values(uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const float* Slot(uint32_t slot, int k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new row for `id`, its values from the initializer and its state fresh; RESOURCE_EXHAUSTED
  // past the memory bound.
  absl::StatusOr<uint32_t> CreateRow(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropRow(uint64_t id, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Initialize(uint64_t id, float* values) const;
  // Gathers the rows of `ids` into a snapshot for `call` (creating or admitting rows); the
  // status to answer it with.
  absl::Status Answer(const std::vector<uint64_t>& ids, ParkedCall& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slots of `ids` into lookup_ (-1: not held). A pass of its own, so that the lookups'
  // cache misses overlap (each find is independent of the last), and rows can be prefetched
  // ahead of the pass that reads them.
  void Lookup(absl::Span<const uint64_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the cache for row `slot`'s values and state (all of its lines), ahead of their use.
  void PrefetchRow(int64_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sums grads into the pending step (sync) or applies them (async).
  void Accumulate(absl::Span<const uint64_t> ids, absl::Span<const float> grads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the pending sums over `examples` (unless `skip`), moves the version on, expires rows,
  // answers pulls.
  void Complete(int64_t examples, bool skip, CallsToFinish& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StepComplete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePulls(CallsToFinish& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t IndexBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const summa::v1::EmbeddingTableSpec spec_;
  const TableContext ctx_;
  const std::unique_ptr<const Optimizer> optimizer_;
  const std::vector<std::string> slot_names_;
  const int dim_;
  const int64_t stride_;  // floats per row: values and slots
  const int64_t row_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, uint32_t> index_ ABSL_GUARDED_BY(mu_);  // id -> slot
  const int64_t chunk_rows_;  // rows per chunk: as many as fill whole huge pages
  std::vector<std::unique_ptr<float, FreeChunk>> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> slot_id_ ABSL_GUARDED_BY(mu_);       // per slot: its row's id
  std::vector<uint64_t> slot_touched_ ABSL_GUARDED_BY(mu_);  // per slot: the step last touched
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> waiting_ ABSL_GUARDED_BY(mu_);  // admission: id -> times seen

  absl::Status retired_ ABSL_GUARDED_BY(mu_);  // Retire's status; OK while the table serves
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t updates_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> next_step_ ABSL_GUARDED_BY(mu_);  // per rank
  // Sync: the step's pushes, summed (id -> row of pending_values_), and who pushed.
  absl::flat_hash_map<uint64_t, uint32_t> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<float> pending_values_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pending_ids_ ABSL_GUARDED_BY(mu_);
  int64_t pending_examples_ ABSL_GUARDED_BY(mu_) = 0;
  bool pending_skip_ ABSL_GUARDED_BY(mu_) = false;  // a push of the step asked to skip it
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);  // per rank, this step

  struct ParkedPull {
    std::shared_ptr<ParkedCall> call;
    std::vector<uint64_t> ids;
    uint64_t target;
    absl::Time deadline;
  };
  std::vector<ParkedPull> parked_ ABSL_GUARDED_BY(mu_);
  SnapshotPool answers_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> lookup_ ABSL_GUARDED_BY(mu_);  // Lookup's answer, reused

  uint64_t rows_created_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rows_expired_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unadmitted_reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_gradients_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rows_pulled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rows_pushed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_EMBEDDING_TABLE_H_
