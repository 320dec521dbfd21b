#include "server/core/checkpoint_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/optimizer.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"

namespace summa::server {
namespace {

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `v`'s raw little-endian bytes into `out`, keeping its capacity.
template <typename T>
void PutRaw(const std::vector<T>& v, std::string* out) {
  out->assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// `bytes` as exactly `n` values into `out` (keeping its capacity), or DATA_LOSS naming `what`.
template <typename T>
absl::Status GetRaw(const std::string& bytes, size_t n, const std::string& what, std::vector<T>* out) {
  if (bytes.size() != n * sizeof(T)) {
    return absl::DataLossError(absl::StrCat(what, " holds ", bytes.size(), " bytes; ", n * sizeof(T), " expected"));
  }
  out->resize(n);
  if (n > 0) std::memcpy(out->data(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

// The slots a table's row-wise optimizer keeps per row, in the order a chunk holds them.
absl::StatusOr<std::vector<std::string>> TableSlotNames(const summa::v1::EmbeddingTableSpec& spec) {
  OptimizerOptions o;
  o.name = spec.optimizer().name();
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<const Optimizer> optimizer, Optimizer::Create(o));
  return optimizer->SlotNames();
}

absl::StatusOr<TableState> DecodeTableState(const CheckpointHeader& h, const summa::v1::TableCheckpoint& in) {
  const std::string what = absl::StrCat("embedding table '", h.tables[in.table()].spec.name(), "' of the checkpoint");
  if (in.next_steps_size() != h.job.world_size || in.waiting_ids_size() != in.waiting_counts_size()) {
    return absl::DataLossError(absl::StrCat(what, " has a malformed state"));
  }
  if (in.updates() > in.version()) return absl::DataLossError(absl::StrCat(what, " has more updates than steps"));
  if (h.job.mode == Mode::kSync) {
    // A sync checkpoint is written only while every table is at the partitions' version.
    if (in.version() != h.version) {
      return absl::DataLossError(absl::StrCat(what, " is at version ", in.version(),
                                              "; a sync checkpoint's tables are at its version, ", h.version));
    }
    for (uint64_t next : in.next_steps()) {
      if (next > in.version()) {
        return absl::DataLossError(
            absl::StrCat(what, " has a push of step ", next - 1, " recorded at version ", in.version()));
      }
    }
  }
  TableState s;
  s.version = in.version();
  s.updates = in.updates();
  s.rows = in.rows();
  s.rows_created = in.rows_created();
  s.rows_expired = in.rows_expired();
  s.dropped_gradients = in.dropped_gradients();
  s.next_steps.assign(in.next_steps().begin(), in.next_steps().end());
  s.waiting_ids.assign(in.waiting_ids().begin(), in.waiting_ids().end());
  s.waiting_counts.assign(in.waiting_counts().begin(), in.waiting_counts().end());
  return s;
}

// `in` into `out` (whose buffers are kept), checked against its table.
absl::Status DecodeTableChunk(const CheckpointTable& table, const summa::v1::TableChunk& in, TableRows* out) {
  const std::string what = absl::StrCat("a chunk of embedding table '", table.spec.name(), "'");
  if (in.ids().size() % sizeof(uint64_t) != 0 || in.slots_size() != static_cast<int>(table.slot_names.size())) {
    return absl::DataLossError(absl::StrCat(what, " is malformed"));
  }
  const size_t n = in.ids().size() / sizeof(uint64_t);
  const size_t floats = n * static_cast<size_t>(table.spec.dim());
  SUMMA_RETURN_IF_ERROR(GetRaw(in.ids(), n, what + "'s ids", &out->ids));
  SUMMA_RETURN_IF_ERROR(GetRaw(in.values(), floats, what + "'s values", &out->values));
  out->slots.resize(table.slot_names.size());
  for (int k = 0; k < in.slots_size(); ++k) {
    SUMMA_RETURN_IF_ERROR(GetRaw(in.slots(k), floats, absl::StrCat(what, "'s ", table.slot_names[k]), &out->slots[k]));
  }
  return GetRaw(in.touched(), n, what + "'s steps touched", &out->touched);
}

// `bytes` as exactly `n` floats, or DATA_LOSS naming `what`.
absl::StatusOr<std::vector<float>> FloatsOf(const std::string& bytes, int64_t n, const std::string& what) {
  if (static_cast<int64_t>(bytes.size()) != n * 4) {
    return absl::DataLossError(absl::StrCat(what, " holds ", bytes.size(), " bytes; ", n * 4, " expected"));
  }
  std::vector<float> out(n);
  if (n > 0) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// `with_shard`: and which shard of how many.
std::string Describe(const JobDescription& j, bool with_shard) {
  const std::string mode = absl::StrCat(JobModeName(j.mode, j.sync_every),
                                        j.sync_every > 0 ? absl::StrCat(" (every ", j.sync_every, " local steps)") : "");
  return absl::StrCat(j.world_size, " workers, ", mode, " mode, partitions of ",
                      j.partition_bytes, " bytes, optimizer ", j.optimizer_name, " with state [",
                      absl::StrJoin(j.slot_names, ", "), "]",
                      with_shard && j.shards > 1 ? absl::StrCat(", shard ", j.shard, " of ", j.shards) : "");
}

absl::StatusOr<PartitionSnapshot> DecodePartition(const CheckpointHeader& h, const PartitionRange& range,
                                                  const summa::v1::PartitionCheckpoint& in) {
  const std::string what = absl::StrCat("partition ", range.id);
  if (in.id() != range.id || in.slots_size() != static_cast<int>(h.job.slot_names.size()) ||
      in.next_steps_size() != h.job.world_size) {
    return absl::DataLossError(absl::StrCat(what, " of the checkpoint is malformed"));
  }
  PartitionSnapshot p;
  p.id = range.id;
  p.version = in.version();
  p.updates = in.updates();
  p.examples_applied = in.examples_applied();
  if (p.updates > p.version) return absl::DataLossError(absl::StrCat(what, " has more updates than steps"));
  if (h.job.mode == Mode::kSync) {
    // A sync checkpoint is taken with every partition at one version, and no rank past it.
    if (in.version() != h.version) {
      return absl::DataLossError(absl::StrCat(what, " is at version ", in.version(),
                                              "; a sync checkpoint's partitions are all at ", h.version));
    }
    for (uint64_t next : in.next_steps()) {
      if (next > in.version()) {
        return absl::DataLossError(absl::StrCat(what, " has a push of step ", next - 1,
                                                " recorded at version ", in.version()));
      }
    }
  }
  SUMMA_ASSIGN_OR_RETURN(p.weights, FloatsOf(in.weights(), range.length, what + "'s weights"));
  for (int i = 0; i < in.slots_size(); ++i) {
    SUMMA_ASSIGN_OR_RETURN(std::vector<float> slot,
                           FloatsOf(in.slots(i), range.length, absl::StrCat(what, "'s ", h.job.slot_names[i])));
    p.slots.push_back(std::move(slot));
  }
  p.next_steps.assign(in.next_steps().begin(), in.next_steps().end());
  return p;
}

}  // namespace

summa::v1::Checkpoint EncodeCheckpointHeader(const JobDescription& job, const std::vector<TensorSpec>& specs,
                                             uint64_t version, absl::Time created,
                                             const std::vector<summa::v1::EmbeddingTableSpec>& tables) {
  summa::v1::Checkpoint c;
  c.set_version(version);
  c.set_world_size(job.world_size);
  c.set_mode(ModeToProto(job.mode));
  c.set_partition_bytes(job.partition_bytes);
  c.set_optimizer(job.optimizer);
  c.set_optimizer_name(job.optimizer_name);
  for (const std::string& name : job.slot_names) c.add_slot_names(name);
  c.set_sync_every(job.sync_every);
  if (job.shards > 1) {
    c.set_shard(job.shard);
    c.set_shards(job.shards);
  }
  c.set_created_unix_seconds(absl::ToUnixSeconds(created));
  for (const TensorSpec& spec : specs) SpecToProto(spec, c.add_params());
  for (const summa::v1::EmbeddingTableSpec& table : tables) *c.add_tables() = table;
  return c;
}

summa::v1::TableRecord EncodeTableState(uint32_t table, const TableState& s) {
  summa::v1::TableRecord record;
  summa::v1::TableCheckpoint& out = *record.mutable_state();
  out.set_table(table);
  out.set_version(s.version);
  out.set_updates(s.updates);
  out.set_rows(s.rows);
  out.set_rows_created(s.rows_created);
  out.set_rows_expired(s.rows_expired);
  out.set_dropped_gradients(s.dropped_gradients);
  out.mutable_next_steps()->Add(s.next_steps.begin(), s.next_steps.end());
  out.mutable_waiting_ids()->Add(s.waiting_ids.begin(), s.waiting_ids.end());
  out.mutable_waiting_counts()->Add(s.waiting_counts.begin(), s.waiting_counts.end());
  return record;
}

void EncodeTableChunk(uint32_t table, const TableRows& rows, summa::v1::TableRecord* out) {
  summa::v1::TableChunk& chunk = *out->mutable_chunk();
  chunk.set_table(table);
  PutRaw(rows.ids, chunk.mutable_ids());
  PutRaw(rows.values, chunk.mutable_values());
  while (chunk.slots_size() > static_cast<int>(rows.slots.size())) chunk.mutable_slots()->RemoveLast();
  while (chunk.slots_size() < static_cast<int>(rows.slots.size())) chunk.add_slots();
  for (size_t k = 0; k < rows.slots.size(); ++k) PutRaw(rows.slots[k], chunk.mutable_slots(static_cast<int>(k)));
  PutRaw(rows.touched, chunk.mutable_touched());
}

summa::v1::PartitionCheckpoint EncodePartition(const PartitionSnapshot& p) {
  summa::v1::PartitionCheckpoint out;
  out.set_id(p.id);
  out.set_version(p.version);
  out.set_updates(p.updates);
  out.set_examples_applied(p.examples_applied);
  out.set_weights(Floats(p.weights));
  for (const std::vector<float>& slot : p.slots) out.add_slots(Floats(slot));
  for (uint64_t next : p.next_steps) out.add_next_steps(next);
  return out;
}

absl::StatusOr<JobDescription> CheckpointJob(const summa::v1::Checkpoint& c) {
  JobDescription job;
  job.world_size = c.world_size();
  absl::StatusOr<Mode> mode = ModeFromProto(c.mode());
  if (!mode.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", mode.status().message()));
  job.mode = *mode;
  job.partition_bytes = c.partition_bytes();
  job.optimizer_name = c.optimizer_name();
  job.optimizer = c.optimizer();
  job.slot_names.assign(c.slot_names().begin(), c.slot_names().end());
  job.sync_every = c.sync_every();
  job.shard = c.shard();
  job.shards = std::max(1, c.shards());
  if (job.shard < 0 || job.shard >= job.shards) {
    return absl::DataLossError(absl::StrCat("the checkpoint names shard ", job.shard, " of ", job.shards));
  }
  return job;
}

absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(const summa::v1::Checkpoint& c,
                                                        const JobDescription& ours, ShardMatch match) {
  CheckpointHeader h;
  SUMMA_ASSIGN_OR_RETURN(h.job, CheckpointJob(c));
  const JobDescription& theirs = h.job;
  const bool shard_taken = match == ShardMatch::kAnyShard || (theirs.shard == ours.shard && theirs.shards == ours.shards);
  if (theirs.world_size != ours.world_size || theirs.mode != ours.mode || !shard_taken ||
      theirs.partition_bytes != ours.partition_bytes || theirs.optimizer_name != ours.optimizer_name ||
      theirs.slot_names != ours.slot_names || theirs.sync_every != ours.sync_every) {
    // Partitions are the unit a checkpoint holds and shards are dealt: a model cut otherwise is
    // another set of partitions, with versions and pushes seen each of its own.
    const std::string cut = theirs.partition_bytes == ours.partition_bytes
                                ? ""
                                : absl::StrCat(" (its partitions are of --partition_bytes=", theirs.partition_bytes,
                                               ", this server's of ", ours.partition_bytes,
                                               ": start it with the checkpoint's)");
    const bool with_shard = match == ShardMatch::kSameShard;
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint is of a job of ", Describe(theirs, with_shard),
                                                      "; this server runs ", Describe(ours, with_shard), cut));
  }
  if (theirs.optimizer != ours.optimizer) {
    SUMMA_LOG(WARNING) << "the checkpoint's optimizer was " << theirs.optimizer << "; going on with "
                       << ours.optimizer << " and its state";
  }
  h.version = c.version();
  h.created = absl::FromUnixSeconds(c.created_unix_seconds());
  std::vector<TensorSpec> specs;
  for (const summa::v1::Tensor& t : c.params()) {
    absl::StatusOr<TensorSpec> spec = SpecFromProto(t);
    if (!spec.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", spec.status().message()));
    specs.push_back(*std::move(spec));
  }
  // Counted before the map is built: a header claiming 2^40 floats in 16-byte partitions would
  // be 2^38 partition ranges, whatever the file holds (found by fuzz/checkpoint_fuzzer).
  constexpr int64_t kMaxPartitions = int64_t{1} << 20;
  int64_t elements = 0;
  for (const TensorSpec& spec : specs) {
    elements += spec.num_elements();  // each at most 2^40 (SpecFromProto): no overflow below 2^62
    if (elements > (int64_t{1} << 62)) return absl::DataLossError("the checkpoint's model is too large");
  }
  const int64_t per_partition = std::max<int64_t>(ours.partition_bytes / 4, 1);
  if ((elements + per_partition - 1) / per_partition > kMaxPartitions) {
    return absl::DataLossError(absl::StrCat("the checkpoint's model of ", elements, " parameters would be over ",
                                            kMaxPartitions, " partitions of ", ours.partition_bytes, " bytes"));
  }
  absl::StatusOr<PartitionMap> map = PartitionMap::Create(std::move(specs), ours.partition_bytes);
  if (!map.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's model: ", map.status().message()));
  h.map = *std::move(map);
  if (static_cast<size_t>(theirs.shards) > h.map.partitions().size()) {
    return absl::DataLossError(absl::StrCat("the checkpoint's model of ", h.map.partitions().size(),
                                            " partitions cannot have been held by ", theirs.shards, " shards"));
  }
  const std::vector<int> shard_of = AssignShards(h.map.partitions(), theirs.shards);
  for (const PartitionRange& r : h.map.partitions()) {
    if (shard_of[r.id] == theirs.shard) h.held.push_back(r);
  }
  for (const summa::v1::EmbeddingTableSpec& given : c.tables()) {
    absl::StatusOr<summa::v1::EmbeddingTableSpec> spec = EmbeddingTable::Normalized(given);
    if (!spec.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", spec.status().message()));
    for (const CheckpointTable& t : h.tables) {
      if (t.spec.name() == spec->name()) {
        return absl::DataLossError(absl::StrCat("the checkpoint declares embedding table '", spec->name(), "' twice"));
      }
    }
    absl::StatusOr<std::vector<std::string>> slots = TableSlotNames(*spec);
    if (!slots.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", slots.status().message()));
    h.tables.push_back({*std::move(spec), *std::move(slots)});
  }
  return h;
}

absl::StatusOr<std::vector<CheckpointHeader>> DecodeCheckpointSet(
    absl::Span<const summa::v1::Checkpoint* const> set, const JobDescription& ours) {
  std::vector<CheckpointHeader> headers;
  for (const summa::v1::Checkpoint* c : set) {
    absl::StatusOr<CheckpointHeader> h = DecodeCheckpointHeader(*c, ours, ShardMatch::kAnyShard);
    if (!h.ok()) {
      return absl::Status(h.status().code(), absl::StrCat("shard ", headers.size(), "'s checkpoint: ", h.status().message()));
    }
    headers.push_back(*std::move(h));
  }
  if (headers.empty()) return absl::FailedPreconditionError("no checkpoint to restore from");
  const CheckpointHeader& first = headers.front();
  if (static_cast<int>(headers.size()) != first.job.shards) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoints are of a job on ", first.job.shards,
                                                      " shards, and ", headers.size(), " came: every shard's is needed"));
  }
  for (size_t i = 0; i < headers.size(); ++i) {
    const CheckpointHeader& h = headers[i];
    if (h.job.shards != first.job.shards || h.job.shard != static_cast<int>(i)) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", i, " of a set of ", headers.size(),
                                                        " is shard ", h.job.shard, " of ", h.job.shards, "'s, not shard ",
                                                        i, " of ", first.job.shards, "'s"));
    }
    if (h.version != first.version) {
      return absl::FailedPreconditionError(absl::StrCat("shard ", i, "'s checkpoint is of version ", h.version,
                                                        " and shard 0's of ", first.version,
                                                        ": a set is of one version"));
    }
    if (h.map.specs() != first.map.specs()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", i, "'s checkpoint is of another model than shard 0's"));
    }
    bool same_tables = h.tables.size() == first.tables.size();
    for (size_t t = 0; same_tables && t < h.tables.size(); ++t) {
      same_tables = h.tables[t].spec.SerializeAsString() == first.tables[t].spec.SerializeAsString();
    }
    if (!same_tables) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", i, "'s checkpoint declares other embedding tables than shard 0's"));
    }
  }
  return headers;
}

absl::Status DecodePartitions(const CheckpointHeader& h, PartitionSource& source,
                              absl::FunctionRef<absl::Status(PartitionSnapshot)> take) {
  const std::vector<PartitionRange>& ranges = h.held;
  summa::v1::PartitionCheckpoint in;
  size_t count = 0;
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, source.Next(&in));
    if (!more) break;
    if (count == ranges.size()) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint holds more partitions than the ", ranges.size(), " of its model"));
    }
    SUMMA_ASSIGN_OR_RETURN(PartitionSnapshot p, DecodePartition(h, ranges[count], in));
    SUMMA_RETURN_IF_ERROR(take(std::move(p)));
    ++count;
  }
  if (count != ranges.size()) {
    return absl::DataLossError(
        absl::StrCat("the checkpoint holds ", count, " partitions; its model has ", ranges.size()));
  }
  return absl::OkStatus();
}

absl::Status DecodeTables(const CheckpointHeader& h, PartitionSource& source,
                          absl::FunctionRef<absl::Status(int table, const TableState&)> state,
                          absl::FunctionRef<absl::Status(int table, const TableRows&)> rows) {
  summa::v1::TableRecord record;
  TableRows chunk;
  int table = -1;  // the table whose records are being read
  uint64_t counted = 0, read = 0;  // its rows, as its state counts them and as its chunks held them
  auto name = [&](int t) { return absl::StrCat("embedding table '", h.tables[t].spec.name(), "'"); };
  auto whole = [&]() -> absl::Status {
    if (table >= 0 && read != counted) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint holds ", read, " rows of ", name(table), ", whose state counts ", counted));
    }
    return absl::OkStatus();
  };
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, source.NextTable(&record));
    if (!more) break;
    if (record.has_state()) {
      SUMMA_RETURN_IF_ERROR(whole());
      const summa::v1::TableCheckpoint& in = record.state();
      if (in.table() >= h.tables.size() || static_cast<int>(in.table()) != table + 1) {
        return absl::DataLossError(absl::StrCat("the checkpoint holds the state of table ", in.table(), " after ",
                                                table < 0 ? std::string("none") : absl::StrCat("table ", table, "'s"),
                                                "; it declares ", h.tables.size(), " table(s)"));
      }
      table = static_cast<int>(in.table());
      SUMMA_ASSIGN_OR_RETURN(const TableState decoded, DecodeTableState(h, in));
      counted = decoded.rows;
      read = 0;
      SUMMA_RETURN_IF_ERROR(state(table, decoded));
    } else if (record.has_chunk()) {
      const summa::v1::TableChunk& in = record.chunk();
      if (table < 0 || static_cast<int>(in.table()) != table) {
        return absl::DataLossError(absl::StrCat("the checkpoint holds rows of table ", in.table(), " where ",
                                                table < 0 ? std::string("no table's") : absl::StrCat(name(table), "'s"),
                                                " belong"));
      }
      SUMMA_RETURN_IF_ERROR(DecodeTableChunk(h.tables[table], in, &chunk));
      read += chunk.ids.size();
      if (read > counted) SUMMA_RETURN_IF_ERROR(whole());
      SUMMA_RETURN_IF_ERROR(rows(table, chunk));
    } else {
      return absl::DataLossError("the checkpoint holds an empty table record");
    }
  }
  SUMMA_RETURN_IF_ERROR(whole());
  if (table + 1 != static_cast<int>(h.tables.size())) {
    return absl::DataLossError(absl::StrCat("the checkpoint holds the records of ", table + 1, " of its ",
                                            h.tables.size(), " embedding table(s)"));
  }
  return absl::OkStatus();
}

void EncodeGroup(const GroupView& group, summa::v1::Checkpoint* header) {
  summa::v1::Group* out = header->mutable_group();
  out->set_view(group.view);
  out->clear_ranks();
  for (int r : group.ranks) out->add_ranks(r);
}

namespace {

absl::StatusOr<GroupView> GroupFrom(uint64_t view, const google::protobuf::RepeatedField<int32_t>& ranks,
                                    int world_size, const char* what) {
  GroupView g;
  g.view = view;
  for (int r : ranks) {
    if (r < 0 || r >= world_size || (!g.ranks.empty() && r <= g.ranks.back())) {
      return absl::DataLossError(absl::StrCat("the checkpoint's ", what, " lists rank ", r, " out of order or outside the ",
                                              world_size, " ranks of its job"));
    }
    g.ranks.push_back(r);
  }
  return g;
}

}  // namespace

absl::StatusOr<std::optional<GroupView>> DecodeGroup(const summa::v1::Checkpoint& header, int world_size) {
  if (!header.has_group()) return std::nullopt;
  return GroupFrom(header.group().view(), header.group().ranks(), world_size, "group");
}

void EncodeGroupLog(const std::vector<GroupChange>& log, summa::v1::Checkpoint* header) {
  header->clear_group_changes();
  for (const GroupChange& change : log) {
    summa::v1::GroupChange* out = header->add_group_changes();
    out->set_from_step(change.from_step);
    out->set_view(change.group.view);
    for (int r : change.group.ranks) out->add_ranks(r);
  }
}

absl::StatusOr<std::vector<GroupChange>> DecodeGroupLog(const summa::v1::Checkpoint& header, int world_size) {
  std::vector<GroupChange> log;
  for (const summa::v1::GroupChange& in : header.group_changes()) {
    if (!log.empty() && in.from_step() <= log.back().from_step) {
      return absl::DataLossError(absl::StrCat("the checkpoint's group changes go back from step ",
                                              log.back().from_step, " to ", in.from_step()));
    }
    SUMMA_ASSIGN_OR_RETURN(GroupView g, GroupFrom(in.view(), in.ranks(), world_size, "group change"));
    log.push_back({in.from_step(), std::move(g)});
  }
  return log;
}

}  // namespace summa::server
