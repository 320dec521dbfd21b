// A directory of checkpoint files, <dir>/ckpt-<version>.summa: their paths and versions, pruning,
// rollback's removal, and restoring from the newest whole one; and a job's checkpoint directory,
// which holds each shard's directory (ShardCheckpointDir) under every shard count the job ran
// with, and what a shard restores from it at start. Thread-safe (free functions).
#ifndef SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_
#define SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
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
  std::string path;  // of a set (from_shards > 0): its shard 0's file
  summa::v1::Checkpoint header;  // of a set: its shard 0's
  // 0: the shard's own checkpoint. Otherwise the shard's partitions came from the whole set of
  // checkpoints of one version that the job's `from_shards` shards wrote (it ran with another
  // shard count).
  int from_shards = 0;
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

// The checkpoints a job wrote into its directory under one shard count: each shard's directory
// and the versions of the files there (whole or not).
struct CheckpointSet {
  int shards = 1;
  std::vector<std::string> dirs;                // by shard
  std::vector<std::vector<uint64_t>> versions;  // by shard, ascending; empty for a shard with none
  // The versions every shard keeps, ascending: the only ones a restore from the set may use.
  std::vector<uint64_t> CommonVersions() const;
};

// The sets in the job's checkpoint directory `dir`: one per shard count of which at least one
// shard has a checkpoint file there, by shard count ascending.
std::vector<CheckpointSet> FindCheckpointSets(const std::string& dir);

// What shard `shard` of a `shards`-shard job restores at start from the job's checkpoint
// directory `dir`: the newest version of its own checkpoints and of every set of another shard
// count (a job restarted with another --shards) that every shard of that set keeps; on a tie its
// own. Its own file goes to `restore`; a set's files, one per old shard in shard order, to
// `reshard`. A version whose file (or a set's file) is torn or corrupt is skipped with a line in
// `warnings` and the next older one tried; any other failure is returned, naming the files.
// nullopt when nothing is left to restore. FAILED_PRECONDITION, naming the versions each of its
// shards keeps, when a set of another shard count has no version every shard keeps (a shard's
// directory lost, say) and checkpoints newer than any usable one: restoring an older one, or
// none, would lose the steps between without a word.
absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreNewestForShard(
    const std::string& dir, int shard, int shards, absl::FunctionRef<absl::Status(CheckpointReader&)> restore,
    absl::FunctionRef<absl::Status(absl::Span<CheckpointReader* const>)> reshard, std::vector<std::string>* warnings);

// For a reader outside any job (summa-checkpoint): the newest checkpoint of the whole model that
// the job's checkpoint directory `dir` holds under any shard count, its own files (one server)
// or a set of K shards' files of one version that every shard keeps; handed to `read` (one
// reader per shard, in shard order), newest version first (on a tie, the fewer shards), until
// one succeeds. A torn or corrupt file is skipped with a line in `warnings`; any other failure of
// `read` is returned, naming the files. The result's from_shards is the set's shard count (1 for
// one server's files); nullopt when `dir` holds none.
absl::StatusOr<std::optional<RestoredCheckpoint>> ReadNewestWholeCheckpoint(
    const std::string& dir, absl::FunctionRef<absl::Status(absl::Span<CheckpointReader* const>)> read,
    std::vector<std::string>* warnings);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_CHECKPOINT_DIR_H_
