#include "server/core/checkpoint_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"

namespace summa::server {
namespace {

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `bytes` as exactly `n` floats, or DATA_LOSS naming `what`.
absl::StatusOr<std::vector<float>> FloatsOf(const std::string& bytes, int64_t n, const std::string& what) {
  if (static_cast<int64_t>(bytes.size()) != n * 4) {
    return absl::DataLossError(absl::StrCat(what, " holds ", bytes.size(), " bytes; ", n * 4, " expected"));
  }
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
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
                                             uint64_t version, absl::Time created) {
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
  return c;
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
