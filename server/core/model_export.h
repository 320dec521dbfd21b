// The model's weights in and out as safetensors (common/safetensors.h): the weights a job starts
// from (--init_from), the file name a caller may give an export, the metadata every export
// carries, and the weights of a checkpoint (or of a sharded job's checkpoints of one version)
// written as one file. A live server's export is ParameterServer::Export. Free functions,
// thread-safe.
#ifndef SUMMA_SERVER_CORE_MODEL_EXPORT_H_
#define SUMMA_SERVER_CORE_MODEL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/safetensors.h"
#include "server/checkpoint/checkpoint_file.h"
#include "server/core/checkpoint_codec.h"

namespace summa::server {

// Weights a job starts from (summa-server --init_from): the tensors in the file's order and
// their values end to end, as float32.
struct InitialWeights {
  std::string source;  // the file, for messages
  std::vector<TensorSpec> specs;
  std::vector<float> flat;
};

// Reads and checks a safetensors file as a model's initial weights: SafetensorsReader's refusals,
// and INVALID_ARGUMENT when its tensors are not a model a server can hold in partitions of
// `partition_bytes` (none, an empty name or dimension) or hold more than `max_model_bytes`.
absl::StatusOr<InitialWeights> ReadInitialWeights(const std::string& path, int64_t partition_bytes,
                                                  int64_t max_model_bytes);

struct ExportedModel {
  std::string path;
  uint64_t version = 0;  // every tensor's (the lowest partition's, in async and ssp mode)
  int tensors = 0;
  uint64_t bytes = 0;  // the file's size
};

// A name for a file in an export directory: OK for a plain name; INVALID_ARGUMENT for one with a
// '/' (a caller never chooses the directory), ".", ".." or a NUL.
absl::Status CheckExportName(const std::string& file_name);
// "model-<version>.safetensors": the name an export takes when its caller gives none.
std::string DefaultExportName(uint64_t version);

// What an export's __metadata__ holds: format "pt" (PyTorch's state_dict names), and the job it
// came from: summa.step (the version: steps completed), summa.mode, summa.world_size,
// summa.optimizer, summa.partition_bytes, summa.created (UTC, RFC 3339) and summa.source (what
// wrote it: "summa-server" or the checkpoint's file).
SafetensorsMetadata ExportMetadata(const JobDescription& job, uint64_t version, absl::Time created,
                                   const std::string& source);

// Writes the weights that `headers` describe as a safetensors file at `path`: one checkpoint
// (DecodeCheckpointHeader), or a sharded job's set of one version (DecodeCheckpointSet, shard
// order), `sources[i]` reading headers[i]'s partitions. Holds the model once in memory (a
// set's partitions interleave by id); the embedding tables' rows are read (to check the file)
// and not written. DATA_LOSS for torn, corrupt or missing partitions or table records (as
// DecodePartitions, DecodeTables); INTERNAL when the file cannot be written.
absl::StatusOr<ExportedModel> ExportCheckpointWeights(absl::Span<const CheckpointHeader> headers,
                                                      absl::Span<PartitionSource* const> sources,
                                                      const std::string& path, const std::string& source);

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_MODEL_EXPORT_H_
