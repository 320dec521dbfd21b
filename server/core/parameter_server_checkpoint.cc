// The checkpoint side of ParameterServer: what the job is, a consistent snapshot of every
// partition written through server/checkpoint/checkpoint_file.h a partition at a time, then every
// embedding table's state and rows a chunk at a time, and the restore that refuses another job's
// and fills the model a partition and a chunk at a time.
//
// Tables and partitions at one version (sync): a worker pushes a step's rows before its dense
// gradients, so a table may be a step ahead of the partitions for a moment (or, its rows still
// in flight, a step behind). A table cannot be copied aside as partitions are (it may be far
// larger than memory allows twice), so its rows are written from the live table, under its lock,
// after the partitions, and a sync checkpoint is taken only while every table is at the
// partitions' version: checked with every partition's lock held, before anything is written, and
// again as each table's state is taken. Otherwise nothing is written and it is retried: an
// unsharded (or forced) checkpoint answers FAILED_PRECONDITION, as it does while partitions are
// between versions, and the daemon's next tick tries again; a sharded job's frozen version is
// written once every table reaches it, and skipped (the next multiple of --checkpoint_every is
// taken) when a table has moved past it before it could be written. Async and ssp checkpoints
// record each table's own version, as they do each partition's.
#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/parameter_server.h"  // the class whose methods these are

namespace summa::server {
namespace {

// `p` as a sync checkpoint holds it, into `out`'s buffers (which keep their capacity). Pushes to
// the step in progress are summed, not applied, and the checkpoint does not hold that sum: after
// a restore their ranks push that step again.
void CopyForSyncCheckpoint(const Partition& p, PartitionSnapshot& out, bool weights_only = false)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // The caller holds p.mu.
  out.id = p.range.id;
  out.version = p.version;
  out.updates = p.updates;
  out.examples_applied = p.examples_applied;
  out.weights.assign(p.weights.begin(), p.weights.end());
  if (weights_only) return;
  out.slots.resize(p.slots.size());
  for (size_t i = 0; i < p.slots.size(); ++i) out.slots[i].assign(p.slots[i].begin(), p.slots[i].end());
  out.next_steps.assign(p.next_step.begin(), p.next_step.end());
  for (uint64_t& next : out.next_steps) next = std::min(next, p.version);
}

// Rows per chunk of `table`'s checkpoint: about 4 MiB of rows, at most 64K of them.
int64_t ChunkRows(const EmbeddingTable& table) {
  constexpr int64_t kChunkBytes = int64_t{4} << 20;
  constexpr int64_t kMaxRows = 65536;
  const int64_t row = static_cast<int64_t>(table.dim()) * (1 + static_cast<int64_t>(table.slot_names().size())) *
                          static_cast<int64_t>(sizeof(float)) +
                      2 * static_cast<int64_t>(sizeof(uint64_t));
  return std::clamp<int64_t>(kChunkBytes / row, 1, kMaxRows);
}

// The first table of `m` not at `version`, or null.
const EmbeddingTable* TableNotAt(absl::Span<const std::unique_ptr<EmbeddingTable>> tables, uint64_t version) {
  for (const auto& t : tables) {
    if (t->version() != version) return t.get();
  }
  return nullptr;
}

// A table not at the version of the checkpoint being written: FAILED_PRECONDITION (retry).
absl::Status TableBetweenVersions(const EmbeddingTable& table, uint64_t table_version, uint64_t version) {
  return absl::FailedPreconditionError(absl::StrCat("embedding table '", table.name(), "' is at version ",
                                                    table_version, ", the partitions at ", version,
                                                    " (a step's rows and its dense gradients are arriving); retry"));
}

// Writes `table` (index `index` of the model's) to `writer`: its state, then its rows in chunks,
// all of one moment (EmbeddingTable::Save holds the table's lock meanwhile). `sync`: the table
// must be at `version` (FAILED_PRECONDITION otherwise, nothing of it written), and a push to the
// step in progress is not recorded (its rank pushes it again after a restore, as for partitions).
absl::Status WriteTable(const EmbeddingTable& table, uint32_t index, bool sync, uint64_t version,
                        CheckpointWriter& writer) {
  TableState state;
  bool stated = false;
  auto write_state = [&]() -> absl::Status {
    if (sync) {
      if (state.version != version) return TableBetweenVersions(table, state.version, version);
      for (uint64_t& next : state.next_steps) next = std::min(next, state.version);
    }
    stated = true;
    return writer.AppendTable(EncodeTableState(index, state));
  };
  summa::v1::TableRecord chunk;
  SUMMA_RETURN_IF_ERROR(table.Save(&state, ChunkRows(table), [&](const TableRows& rows) -> absl::Status {
    if (!stated) SUMMA_RETURN_IF_ERROR(write_state());
    EncodeTableChunk(index, rows, &chunk);
    return writer.AppendTable(chunk);
  }));
  return stated ? absl::OkStatus() : write_state();  // a table without rows
}

}  // namespace

JobDescription ParameterServer::Job() const {
  JobDescription j;
  j.world_size = options_.world_size;
  j.mode = options_.mode;
  j.partition_bytes = options_.partition_bytes;
  j.shard = options_.shard;
  j.shards = options_.shards;
  j.optimizer_name = optimizer_->name();
  j.optimizer = optimizer_->Describe();
  j.slot_names = optimizer_->SlotNames();
  j.sync_every = options_.sync_every;
  return j;
}

absl::StatusOr<std::pair<std::unique_ptr<ParameterServer::Model>, uint64_t>> ParameterServer::ModelFrom(
    absl::Span<const ShardCheckpoint> pieces, bool resharded) const {
  std::vector<CheckpointHeader> headers;
  if (resharded) {
    std::vector<const summa::v1::Checkpoint*> set;
    for (const ShardCheckpoint& piece : pieces) set.push_back(piece.header);
    SUMMA_ASSIGN_OR_RETURN(headers, DecodeCheckpointSet(set, Job()));
  } else {
    SUMMA_ASSIGN_OR_RETURN(CheckpointHeader h, DecodeCheckpointHeader(*pieces.front().header, Job()));
    headers.push_back(std::move(h));
  }
  std::vector<summa::v1::EmbeddingTableSpec> tables;
  for (const CheckpointTable& t : headers.front().tables) tables.push_back(t.spec);
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, NewModel(headers.front().map.specs(), {}, tables));
  // Resharded: each table's state as the old shards' states read so far make it (MergeTableState).
  std::vector<TableState> merged(model->tables.size());
  uint64_t low = UINT64_MAX;
  size_t filled = 0;
  for (size_t i = 0; i < headers.size(); ++i) {
    const CheckpointHeader& h = headers[i];
    const bool holds_ours = std::any_of(h.held.begin(), h.held.end(),
                                        [&](const PartitionRange& r) { return model->index_of[r.id] >= 0; });
    PartitionSource& source = *pieces[i].partitions;
    auto restore_state = [&](int t, const TableState& state) {
      EmbeddingTable& table = *model->tables[t];
      if (!resharded) {
        table.RestoreState(state);
      } else {
        MergeTableState(static_cast<int>(i), state, merged[t]);
        table.RestoreState(merged[t]);
      }
      return absl::OkStatus();
    };
    auto restore_rows = [&](int t, const TableRows& rows) { return model->tables[t]->RestoreRows(rows); };
    if (!holds_ours) {
      // Another shard's partitions only: not read. Its table rows may be this shard's now (a
      // file's partitions are skipped on the way to them, unparsed).
      if (!model->tables.empty()) SUMMA_RETURN_IF_ERROR(DecodeTables(h, source, restore_state, restore_rows));
      continue;
    }
    SUMMA_RETURN_IF_ERROR(DecodePartitions(h, source, [&](PartitionSnapshot snap) {
      const int at = model->index_of[snap.id];
      if (at < 0) return absl::OkStatus();  // another shard's now
      Partition& p = *model->partitions[at];
      absl::MutexLock plock(&p.mu);
      // Copied into the partition's own buffers: the optimizer holds views of the slots.
      std::copy(snap.weights.begin(), snap.weights.end(), p.weights.begin());
      for (size_t k = 0; k < snap.slots.size(); ++k) std::copy(snap.slots[k].begin(), snap.slots[k].end(), p.slots[k].begin());
      p.initialized = true;
      p.version = snap.version;
      p.updates = snap.updates;
      p.examples_applied = snap.examples_applied;
      p.next_step = std::move(snap.next_steps);
      low = std::min(low, snap.version);
      ++filled;
      return absl::OkStatus();
    }));
    // Read to its end, tables or none: a file checks its CRC there.
    SUMMA_RETURN_IF_ERROR(DecodeTables(h, source, restore_state, restore_rows));
  }
  // A whole set (or this shard's own checkpoint) holds each partition once.
  if (filled != model->partitions.size()) {
    return absl::DataLossError(absl::StrCat("the checkpoints hold ", filled, " of this shard's ",
                                            model->partitions.size(), " partitions"));
  }
  model->pending = 0;
  return std::make_pair(std::move(model), low);
}

void ParameterServer::MergeTableState(int from, const TableState& state, TableState& into) const {
  if (from == 0) {
    into.version = state.version;
    into.updates = state.updates;
    into.next_steps = state.next_steps;
  } else if (options_.mode != Mode::kSync) {
    // Each shard's table counts its own pushes: the most any recorded, so no push is applied twice.
    into.version = std::max(into.version, state.version);
    into.updates = std::max(into.updates, state.updates);
    for (size_t r = 0; r < into.next_steps.size() && r < state.next_steps.size(); ++r) {
      into.next_steps[r] = std::max(into.next_steps[r], state.next_steps[r]);
    }
  }
  // Sync: shard 0's steps (every shard's table is at the set's version, DecodeTables checked).
  if (from % options_.shards == options_.shard) {
    into.rows_created += state.rows_created;
    into.rows_expired += state.rows_expired;
    into.dropped_gradients += state.dropped_gradients;
  }
  // The old shard's own: RestoreState keeps those of this shard's ids, beside those kept before.
  into.waiting_ids = state.waiting_ids;
  into.waiting_counts = state.waiting_counts;
}

absl::Status ParameterServer::Adopt(std::pair<std::unique_ptr<Model>, uint64_t> restored,
                                    const summa::v1::Checkpoint& header) {
  SUMMA_ASSIGN_OR_RETURN(const std::optional<GroupView> group, DecodeGroup(header, options_.world_size));
  SUMMA_ASSIGN_OR_RETURN(std::vector<GroupChange> log, DecodeGroupLog(header, options_.world_size));
  PublishModel(std::move(restored.first));
  if (group.has_value()) membership_.Restore(*group);
  restored_.store(true, std::memory_order_release);
  absl::MutexLock info(&info_mu_);
  if (!log.empty()) group_log_ = std::move(log);
  checkpoint_.version = restored.second;
  checkpoint_.written = absl::FromUnixSeconds(header.created_unix_seconds());
  return absl::OkStatus();
}

absl::Status ParameterServer::Restore(const summa::v1::Checkpoint& header, PartitionSource& partitions) {
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  // Built unpublished, so a checkpoint found torn halfway leaves no model behind.
  const ShardCheckpoint own = {&header, &partitions};
  SUMMA_ASSIGN_OR_RETURN(auto restored, ModelFrom({own}, /*resharded=*/false));
  return Adopt(std::move(restored), header);
}

absl::Status ParameterServer::RestoreResharded(absl::Span<const ShardCheckpoint> set) {
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  SUMMA_ASSIGN_OR_RETURN(auto restored, ModelFrom(set, /*resharded=*/true));
  return Adopt(std::move(restored), *set.front().header);  // shard 0's group: it coordinated the job
}

absl::StatusOr<bool> ParameterServer::RollBack(int rank, uint64_t session, uint64_t to_version,
                                               uint64_t from_version) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  if (options_.mode != Mode::kSync) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a rollback keeps shards at one version, which only sync mode has; this server runs ",
        ModeName(options_.mode), " mode"));
  }
  if (checkpoint_dir_.empty()) {
    return absl::FailedPreconditionError("this server keeps no checkpoints to roll back to (--checkpoint_dir)");
  }
  SUMMA_RETURN_IF_ERROR(membership_.CheckSession(rank, session));
  // No checkpoint of the history being abandoned is written meanwhile.
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  SUMMA_ASSIGN_OR_RETURN(const Model* const old, ReadyModel());
  uint64_t at = UINT64_MAX, high = 0;
  for (const auto& p : old->partitions) {
    absl::ReaderMutexLock lock(&p->mu);
    at = std::min(at, p->version);
    high = std::max(high, p->version);
  }
  if (at == to_version && high == to_version) return false;  // another member asked first
  if (to_version > at) {
    return absl::FailedPreconditionError(absl::StrCat("this server is at version ", at, ": it rolls back, not forward to ",
                                                      to_version));
  }
  if (at != from_version) {
    return absl::AbortedError(absl::StrCat("this server is at version ", at, ", not ", from_version,
                                           " as rank ", rank, " saw it: join again and look"));
  }
  const std::string path = CheckpointPath(checkpoint_dir_, to_version);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
  if (absl::IsNotFound(reader.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server keeps no checkpoint of version ", to_version, " (it keeps ",
        absl::StrJoin(CheckpointVersions(checkpoint_dir_), ", "), " in ", checkpoint_dir_,
        "); start every shard with a larger --keep_checkpoints"));
  }
  if (!reader.ok()) return reader.status();
  const ShardCheckpoint own = {&(*reader)->header(), reader->get()};
  const absl::Status gone = absl::NotFoundError(absl::StrCat(
      "the server rolled back to version ", to_version, " to agree with the other shards; Join again"));
  {
    // The old tables go before the checkpoint's are read: a table is never held twice (its
    // history is abandoned either way; were the restore to fail, they would refuse every call
    // until the server restarts, as every call of a rolled-back shard is refused).
    CallsToFinish failed;
    for (const auto& t : old->tables) t->Retire(gone, failed);
  }
  SUMMA_ASSIGN_OR_RETURN(auto restored, ModelFrom({own}, /*resharded=*/false));
  if (restored.second != to_version) {
    return absl::DataLossError(absl::StrCat(path, " holds version ", restored.second, ", not ", to_version));
  }
  CallsToFinish failed;
  {
    // Join admits and reads the model under define_mu_: it sees the old model with a session
    // this voids, or the new one.
    absl::MutexLock define(&define_mu_);
    // Members first: a call that reads the new model once it is published finds its session void.
    membership_.Forget();
    for (const auto& p : old->partitions) {
      absl::MutexLock plock(&p->mu);
      p->retired = true;
      p->parked.FailAll(gone, failed);
      p->clock_parked.FailAll(gone, failed);
      // Nothing reads a retired partition's values again: only its lock and flag stay.
      std::vector<float>().swap(p->weights);
      for (auto& slot : p->slots) std::vector<float>().swap(slot);
      p->slot_views.clear();
      p->frozen = PartitionSnapshot();
      p->aggregator = Aggregator(0);
      p->published = Snapshot();
    }
    retired_.push_back(std::move(model_owner_));
    PublishModel(std::move(restored.first));
    restored_.store(true, std::memory_order_release);
  }
  failed.FinishAll();
  absl::Status pruned = RemoveCheckpointsAfter(checkpoint_dir_, to_version);
  if (!pruned.ok()) SUMMA_LOG(WARNING) << "after the rollback: " << pruned.message();
  {
    absl::MutexLock info(&info_mu_);
    checkpoint_ = {path, to_version, absl::FromUnixSeconds((*reader)->header().created_unix_seconds())};
    ++rollbacks_;
    last_rollback_version_ = to_version;
  }
  SUMMA_LOG(WARNING) << "rolled back from version " << at << " to version " << to_version << " (" << path
                     << ") at rank " << rank << "'s request, to agree with the other shards; "
                     << "every member joins again";
  return true;
}

void ParameterServer::MaybeFreeze(const Model& model, Partition& p) {
  const int64_t every = options_.checkpoint_every;
  if (!FreezesForCheckpoints() ||
      p.version % static_cast<uint64_t>(every) != 0) {
    return;
  }
  CopyForSyncCheckpoint(p, p.frozen);
  p.has_frozen = true;
  // Partitions step together: every one freezes a version before any reaches the next.
  if ((model.frozen.fetch_add(1, std::memory_order_acq_rel) + 1) % model.partitions.size() == 0 && checkpoint_due_) {
    checkpoint_due_();
  }
}

ParameterServer::MomentCopy ParameterServer::CopyAtOneMoment(
    const Model& m, bool frozen, bool weights_only, absl::FunctionRef<bool(uint64_t, uint64_t)> take) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // every partition's lock, taken and released in id order
  MomentCopy out;
  for (const auto& p : m.partitions) p->mu.Lock();
  for (const auto& p : m.partitions) {
    const uint64_t v = frozen ? (p->has_frozen ? p->frozen.version : 0) : p->version;
    out.low = std::min(out.low, v);
    out.high = std::max(out.high, v);
  }
  if (take(out.low, out.high)) {
    out.copies.reserve(m.partitions.size());
    for (const auto& p : m.partitions) {
      if (frozen) {
        out.copies.push_back(p->frozen);
        continue;
      }
      out.copies.emplace_back();
      CopyForSyncCheckpoint(*p, out.copies.back(), weights_only);
    }
  }
  for (auto it = m.partitions.rbegin(); it != m.partitions.rend(); ++it) (*it)->mu.Unlock();
  return out;
}

absl::StatusOr<ExportedModel> ParameterServer::Export(const std::string& dir, const std::string& file_name) {
  SUMMA_RETURN_IF_ERROR(CheckExportName(file_name));
  if (options_.shards > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server is shard ", options_.shard, " of ", options_.shards,
        " and holds only its partitions: export a sharded job's weights from its checkpoints with "
        "summa-checkpoint export ", options_.checkpoint_dir.empty() ? "CHECKPOINT_DIR" : options_.checkpoint_dir,
        " OUT.safetensors (every shard's newest checkpoint of one version, assembled)"));
  }
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "this server has no directory to export into: start it with --export_dir (or --checkpoint_dir)");
  }
  // Not beside a rollback, which replaces the model (and empties the old one's partitions).
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  SUMMA_ASSIGN_OR_RETURN(const Model* const m, ReadyModel());
  const bool one_version = policy_->CheckpointNeedsOneVersion();
  MomentCopy moment = CopyAtOneMoment(*m, /*frozen=*/false, /*weights_only=*/true,
                                      [&](uint64_t low, uint64_t high) { return !one_version || low == high; });
  if (moment.copies.empty()) {
    return absl::UnavailableError(absl::StrCat("the partitions are between versions ", moment.low, " and ",
                                               moment.high, " (a step is completing); retry"));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("create ", dir, ": ", error.message()));
  const std::string path =
      absl::StrCat(dir, "/", file_name.empty() ? DefaultExportName(moment.low) : file_name);
  const std::vector<TensorSpec>& specs = m->map.specs();
  SUMMA_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsWriter> writer,
      SafetensorsWriter::Create(path, specs, ExportMetadata(Job(), moment.low, options_.clock->Now(), "summa-server")));
  for (PartitionSnapshot& copy : moment.copies) {
    SUMMA_RETURN_IF_ERROR(writer->Append(copy.weights));
    std::vector<float>().swap(copy.weights);  // freed once written
  }
  SUMMA_ASSIGN_OR_RETURN(const uint64_t bytes, writer->Finish());
  SUMMA_LOG(INFO) << "exported version " << moment.low << " (" << specs.size() << " tensors, " << bytes
                  << " bytes) to " << path;
  return ExportedModel{path, moment.low, static_cast<int>(specs.size()), bytes};
}

absl::Status ParameterServer::MaybeCheckpoint(bool force) {
  if (checkpoint_dir_.empty()) return absl::OkStatus();
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  const Model* m = model();
  if (m == nullptr || m->pending.load() > 0) return absl::OkStatus();  // nothing to keep yet
  uint64_t last;
  {
    absl::MutexLock info(&info_mu_);
    last = checkpoint_.version;
  }
  const bool one_version = policy_->CheckpointNeedsOneVersion();
  // Sync: every partition at one moment, so all their locks (in id order) are held while they
  // are copied. Async and ssp: each partition records its own version and pushes, so each is
  // copied under its own lock alone, as it is written.
  // Sync shards, when not forced: the copies every partition took as it reached the same multiple
  // of --checkpoint_every (MaybeFreeze), so that every shard writes the same versions.
  const bool frozen = !force && FreezesForCheckpoints();
  bool due = false, consistent = false, write = false;
  const EmbeddingTable* table_apart = nullptr;  // sync: a table not at the partitions' version
  MomentCopy moment = CopyAtOneMoment(*m, frozen, /*weights_only=*/false, [&](uint64_t low, uint64_t high) {
    // Frozen copies are of multiples of the interval: any newer than the last file is due (a
    // forced checkpoint or a restore in between skips none).
    due = force || (frozen ? low > last
                           : options_.checkpoint_every > 0 &&
                                 low >= last + static_cast<uint64_t>(options_.checkpoint_every));
    consistent = !one_version || low == high;
    // Tables after the partitions' locks (Admit's order too); checked again as each is written.
    if (due && consistent && one_version) table_apart = TableNotAt(m->tables, low);
    write = due && consistent && table_apart == nullptr && (low != last || force);
    return write && one_version;
  });
  const uint64_t low = moment.low;
  std::vector<PartitionSnapshot>& copies = moment.copies;
  if (!due) return absl::OkStatus();
  if (!consistent) {
    // Frozen copies of unlike versions: the newest is still being taken (or the writer fell
    // more than --checkpoint_every steps behind, and that version is skipped).
    if (frozen) return absl::OkStatus();
    return absl::FailedPreconditionError("partitions are between versions; retry");
  }
  if (table_apart != nullptr) {
    // Frozen: the next tick looks again (a table behind catches up; one past the frozen version
    // leaves it to the next multiple).
    if (frozen) return absl::OkStatus();
    return TableBetweenVersions(*table_apart, table_apart->version(), low);
  }
  if (!write) return absl::OkStatus();  // nothing new since the last one
  const absl::Time created = options_.clock->Now();
  // `low`: in async and ssp mode, partitions may move past it before they are copied.
  std::vector<summa::v1::EmbeddingTableSpec> tables;
  for (const auto& t : m->tables) tables.push_back(t->spec());
  summa::v1::Checkpoint header = EncodeCheckpointHeader(Job(), m->map.specs(), low, created, tables);
  // The group as it is now (a sync shard's frozen copies may be of an earlier version: a rank
  // excluded since stays excluded, which is what a restore should find).
  EncodeGroup(membership_.CheckpointGroup(), &header);
  EncodeGroupLog(GroupLog(), &header);
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                         CheckpointWriter::Create(checkpoint_dir_, header));
  for (size_t i = 0; i < m->partitions.size(); ++i) {
    PartitionSnapshot snap;
    if (one_version) {
      snap = std::move(copies[i]);  // freed once written
    } else {
      const Partition& p = *m->partitions[i];
      absl::MutexLock plock(&p.mu);
      snap = {p.range.id, p.version, p.updates, p.weights, p.slots, p.next_step};
    }
    SUMMA_RETURN_IF_ERROR(writer->Append(EncodePartition(snap)));
  }
  for (size_t t = 0; t < m->tables.size(); ++t) {
    // A sync table that moved on meanwhile: the file is dropped (its writer removes it).
    SUMMA_RETURN_IF_ERROR(WriteTable(*m->tables[t], static_cast<uint32_t>(t), one_version, low, *writer));
  }
  SUMMA_ASSIGN_OR_RETURN(const std::string path, writer->Finish(options_.keep_checkpoints));
  absl::MutexLock info(&info_mu_);
  checkpoint_ = {path, low, created};
  SUMMA_LOG(INFO) << "checkpoint at version " << low << " written to " << path;
  return absl::OkStatus();
}

}  // namespace summa::server
