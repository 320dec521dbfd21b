// Checkpoints of the server's state: master weights, optimizer state, version and the job's
// description, written atomically (temporary file, fsync, rename, directory fsync) with a CRC,
// and restored from the newest file that is whole. Free functions; thread-safe.
#ifndef SUMMA_SERVER_CHECKPOINT_H_
#define SUMMA_SERVER_CHECKPOINT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

// Writes `checkpoint` as <dir>/ckpt-<version>.summa and removes all but the newest `keep`.
// Returns the path written.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const summa::v1::Checkpoint& checkpoint, int keep = 2);

// Reads and verifies one checkpoint file: DATA_LOSS for a torn or corrupt file.
absl::StatusOr<summa::v1::Checkpoint> ReadCheckpoint(const std::string& path);

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
