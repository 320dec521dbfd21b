// Checkpoints of the server's state as messages: every partition's master weights, optimizer
// state slots, version and pushes seen, with the job's description, and every embedding table's
// state and rows; encoded from and decoded into plain snapshots (a restore into a job that
// differs is refused, naming both sides). Files are server/checkpoint/'s. Free functions are
// thread-safe.
#ifndef SUMMA_SERVER_CORE_CHECKPOINT_CODEC_H_
#define SUMMA_SERVER_CORE_CHECKPOINT_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "server/checkpoint/checkpoint_file.h"
#include "server/core/embedding_table.h"
#include "server/core/group_view.h"
#include "server/core/job_options.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

// What a checkpoint says of its job. A restore refuses a different size, mode, partitioning,
// optimizer kind or state slots; changed hyperparameters (`optimizer`) are allowed and logged.
struct JobDescription {
  int world_size = 0;
  Mode mode = Mode::kSync;
  int64_t partition_bytes = 0;
  std::string optimizer_name;
  std::string optimizer;
  std::vector<std::string> slot_names;
  int sync_every = 0;  // DiLoCo's H; 0 for a job of gradients
  int shard = 0;   // this server's shard of `shards`: which partitions its checkpoints hold
  int shards = 1;
};

struct PartitionSnapshot {
  uint32_t id = 0;
  uint64_t version = 0;
  uint64_t updates = 0;
  std::vector<float> weights;
  std::vector<std::vector<float>> slots;  // by JobDescription::slot_names
  std::vector<uint64_t> next_steps;       // per rank
  uint64_t examples_applied = 0;          // sync: examples of the steps completed, summed
};

// Everything in a checkpoint but its partitions and its tables' records. `version`: no partition
// is below it (in sync mode every partition, and every table, is at it). `tables`: the job's
// embedding tables' specs (EmbeddingTable::spec), in declaration order.
summa::v1::Checkpoint EncodeCheckpointHeader(const JobDescription& job, const std::vector<TensorSpec>& specs,
                                             uint64_t version, absl::Time created,
                                             const std::vector<summa::v1::EmbeddingTableSpec>& tables = {});
summa::v1::PartitionCheckpoint EncodePartition(const PartitionSnapshot& partition);
// Table `table` (its index in the header's tables): its state, which comes first, then its rows,
// a chunk at a time, into `out` (whose buffers are kept for the next chunk).
summa::v1::TableRecord EncodeTableState(uint32_t table, const TableState& state);
void EncodeTableChunk(uint32_t table, const TableRows& rows, summa::v1::TableRecord* out);

// An embedding table a checkpoint declares: its spec (normalized) and its optimizer's slots, in
// the order a chunk holds them.
struct CheckpointTable {
  summa::v1::EmbeddingTableSpec spec;
  std::vector<std::string> slot_names;
};

// A checkpoint's header, decoded and checked against this server's job.
struct CheckpointHeader {
  JobDescription job;  // the checkpoint's; differs from ours in `optimizer` at most
  PartitionMap map;    // the model's tensors and partitions
  std::vector<PartitionRange> held;  // the partitions the checkpoint must hold: its shard's
  std::vector<CheckpointTable> tables;  // in declaration order; none in checkpoints from before them
  uint64_t version = 0;
  absl::Time created = absl::InfinitePast();
};

// Which checkpoints a server takes: its own shard's (the same shard of the same shard count), or
// any shard's of the job under another shard count, whose partitions it sorts out by id (a job
// restarted with another --shards).
enum class ShardMatch { kSameShard, kAnyShard };

// The job a checkpoint's header records, checked against nothing (an offline reader's "ours");
// DATA_LOSS for an unknown mode or a shard outside its count.
absl::StatusOr<JobDescription> CheckpointJob(const summa::v1::Checkpoint& header);

// FAILED_PRECONDITION naming both sides when the checkpoint's job differs from `ours` (in its shard
// and shard count too under kSameShard); DATA_LOSS when the header is malformed (a table's spec
// too). `held` is the checkpoint's shard's, as AssignShards cut the model over the checkpoint's
// shard count.
absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(const summa::v1::Checkpoint& header,
                                                        const JobDescription& ours,
                                                        ShardMatch match = ShardMatch::kSameShard);

// The headers of the checkpoints a job's shards wrote under one shard count K, `set[i]` being
// shard i's, decoded as DecodeCheckpointHeader(kAnyShard) does, each against `ours`. Together
// their partitions are the whole model: FAILED_PRECONDITION naming what is missing or differs
// when they are not the K shards' of K, in shard order, of one version and one model (its tables
// included).
absl::StatusOr<std::vector<CheckpointHeader>> DecodeCheckpointSet(
    absl::Span<const summa::v1::Checkpoint* const> set, const JobDescription& ours);

// Reads every partition of `source`, checks it against `header` and hands it to `take` before
// reading the next. DATA_LOSS when the partitions do not tile the model (in id order), or a sync
// checkpoint's are not all at its version; the source's error when it fails; `take`'s when it
// does (nothing more is read).
absl::Status DecodePartitions(const CheckpointHeader& header, PartitionSource& source,
                              absl::FunctionRef<absl::Status(PartitionSnapshot)> take);

// Reads every table record of `source` (after its partitions, which it skips if they were not
// read), checks each against `header` and hands it on before reading the next: a table's state
// to `state`, then its rows, a chunk at a time, to `rows` (`table`: its index in the header's
// tables). DATA_LOSS when the records are not, for each declared table in turn, its state and
// then chunks of exactly the rows its state counts; when a chunk is unlike its table (dimension,
// slots) or a state unlike the job (ranks); and when a sync checkpoint's table is not at the
// checkpoint's version or records a push past it. The source's error when it fails (reading to
// the end checks a file's CRC: a caller that wants no table still calls this); `state`'s or
// `rows`'s when one does (nothing more is read).
absl::Status DecodeTables(const CheckpointHeader& header, PartitionSource& source,
                          absl::FunctionRef<absl::Status(int table, const TableState&)> state,
                          absl::FunctionRef<absl::Status(int table, const TableRows&)> rows);

// The group a checkpoint was written under, and back: nullopt for a checkpoint that records none
// (every rank in); DATA_LOSS for ranks outside [0, world_size) or out of order.
void EncodeGroup(const GroupView& group, summa::v1::Checkpoint* header);
absl::StatusOr<std::optional<GroupView>> DecodeGroup(const summa::v1::Checkpoint& header, int world_size);
// The steps' groups (ParameterServer::GroupLog), oldest first; DATA_LOSS for ranks out of order or
// outside the job, or steps out of order.
void EncodeGroupLog(const std::vector<GroupChange>& log, summa::v1::Checkpoint* header);
absl::StatusOr<std::vector<GroupChange>> DecodeGroupLog(const summa::v1::Checkpoint& header, int world_size);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_CHECKPOINT_CODEC_H_
