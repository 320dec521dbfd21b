// Checkpoints of the server's state: every partition's master weights, optimizer state slots,
// version and pushes seen, with the job's description; encoded from and decoded into plain
// snapshots (a restore into a job that differs is refused, naming both sides), written
// atomically (temporary file, fsync, rename, directory fsync) with a CRC, and restored from the
// newest file that is whole. Free functions; thread-safe.
#ifndef SUMMA_SERVER_CHECKPOINT_H_
#define SUMMA_SERVER_CHECKPOINT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "server/job_options.h"
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
};

struct PartitionSnapshot {
  uint32_t id = 0;
  uint64_t version = 0;
  uint64_t updates = 0;
  std::vector<float> weights;
  std::vector<std::vector<float>> slots;  // by JobDescription::slot_names
  std::vector<uint64_t> next_steps;       // per rank
};

struct ServerSnapshot {
  JobDescription job;
  std::vector<TensorSpec> specs;
  std::vector<PartitionSnapshot> partitions;
  absl::Time created = absl::InfinitePast();
  // The lowest partition version.
  uint64_t version() const;
};

summa::v1::Checkpoint EncodeCheckpoint(const ServerSnapshot& snapshot);

// FAILED_PRECONDITION naming both sides when the checkpoint's job differs from `ours`; DATA_LOSS
// when its partitions do not tile its model.
absl::StatusOr<ServerSnapshot> DecodeCheckpoint(const summa::v1::Checkpoint& checkpoint,
                                                const JobDescription& ours);

// Writes `checkpoint` as <dir>/ckpt-<version>.summa and removes all but the newest `keep`.
// Returns the path written.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const summa::v1::Checkpoint& checkpoint, int keep = 2);

// Reads and verifies one checkpoint file: DATA_LOSS for a torn or corrupt file.
absl::StatusOr<summa::v1::Checkpoint> ReadCheckpoint(const std::string& path);

// A checkpoint file's bytes (magic, length, the encoded message, CRC-32), as WriteCheckpoint
// writes them (INTERNAL when the message cannot be encoded), and their verification and parse,
// as ReadCheckpoint does it: DATA_LOSS, prefixed with `name`, for bytes that are torn or corrupt.
absl::StatusOr<std::string> FrameCheckpoint(const summa::v1::Checkpoint& checkpoint);
absl::StatusOr<summa::v1::Checkpoint> ParseCheckpointBytes(absl::string_view file, absl::string_view name);

struct RestoredCheckpoint {
  summa::v1::Checkpoint checkpoint;
  std::string path;
};

// The newest whole checkpoint in `dir` (by version), or nullopt when there is none. Files that
// fail to read are skipped, each with a line in `warnings`.
std::optional<RestoredCheckpoint> LoadNewestCheckpoint(const std::string& dir,
                                                       std::vector<std::string>* warnings);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_H_
