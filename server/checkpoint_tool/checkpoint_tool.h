// summa-checkpoint's commands as a library (its main only parses the command line): a checkpoint's
// header as a person reads it, and its weights exported as safetensors. CKPT is a checkpoint file,
// or a job's checkpoint directory (summa-server --checkpoint_dir): its newest whole checkpoint,
// one server's or a sharded job's K shards' files of one version, assembled into the whole
// model. Nothing here needs a running server. Thread-compatible (free functions writing to `out`).
#ifndef SUMMA_SERVER_CHECKPOINT_TOOL_CHECKPOINT_TOOL_H_
#define SUMMA_SERVER_CHECKPOINT_TOOL_CHECKPOINT_TOOL_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace summa::server {

// Prints the header of CKPT (each shard's, for a set): the job (workers, mode, optimizer,
// partition bytes), version, created time, shard i of K, group, and the tensors (their count and
// parameters; each name and shape with `tensors`); then, once every file is read to its end
// and found whole, the embedding tables (name, dim, optimizer, rows on every shard, version). NOT_FOUND when CKPT holds no checkpoint;
// DATA_LOSS for a torn or corrupt file (a directory's are skipped, with a line on `out`, for the
// next older one).
absl::Status ShowCheckpoint(const std::string& ckpt, bool tensors, std::ostream& out);

// Prints CKPT's header (as ShowCheckpoint without the tensors), then writes its weights to
// `out_path` as safetensors (common/safetensors.h; metadata as server/core/model_export.h says)
// and prints what it wrote; the embedding tables' rows are not exported (it says so).
// FAILED_PRECONDITION for a file that is one shard's of several (its directory assembles them);
// DATA_LOSS for a torn or corrupt file; INTERNAL when `out_path` cannot be written.
absl::Status ExportCheckpoint(const std::string& ckpt, const std::string& out_path, std::ostream& out);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_TOOL_CHECKPOINT_TOOL_H_
