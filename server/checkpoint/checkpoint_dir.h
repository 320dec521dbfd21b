// A directory of checkpoint files, <dir>/ckpt-<version>.summa: their paths and versions, pruning,
// rollback's removal, and restoring from the newest whole one; and where each shard keeps its own
// in a job's checkpoint directory (ShardCheckpointDir). Thread-safe (free functions).
#ifndef SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_
#define SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "server/checkpoint/checkpoint_file.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

// The file a checkpoint of `version` is written to in `dir`.
std::string CheckpointPath(const std::string& dir, uint64_t version);
// The versions of the checkpoint files in `dir` (whole or not), ascending; none when it does not
// exist.
std::vector<uint64_t> CheckpointVersions(const std::string& dir);
// Removes the checkpoints in `dir` of versions above `version`: a history a rollback abandoned.
// INTERNAL naming the file that could not be removed.
absl::Status RemoveCheckpointsAfter(const std::string& dir, uint64_t version);

struct RestoredCheckpoint {
  std::string path;
  summa::v1::Checkpoint header;
};

// Restores from the newest whole checkpoint in `dir` (by version): hands each file's reader to
// `restore`, newest first, until one succeeds, and returns that file, or nullopt when none is
// left. A file that is torn or corrupt is skipped with a line in `warnings` (so `restore` must
// leave nothing behind when it fails); any other failure of `restore` (another job's checkpoint)
// is returned, naming the file.
absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreNewestCheckpoint(
    const std::string& dir, absl::FunctionRef<absl::Status(CheckpointReader&)> restore,
    std::vector<std::string>* warnings);

// Removes all but the newest `keep` checkpoint files in `dir`.
void KeepNewestCheckpoints(const std::string& dir, int keep);

// The directory shard `shard` of a `shards`-shard job keeps its checkpoints in, within the job's
// checkpoint directory `dir` (summa-server's --checkpoint_dir): `dir` itself for one server,
// dir/shard-I-of-K for a shard, so that shards may share one directory. Empty for an empty `dir`.
std::string ShardCheckpointDir(const std::string& dir, int shard, int shards);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_
