#include "server/core/model_export.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::server {

absl::StatusOr<InitialWeights> ReadInitialWeights(const std::string& path, int64_t partition_bytes,
                                                  int64_t max_model_bytes) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader, SafetensorsReader::Open(path));
  InitialWeights weights;
  weights.source = path;
  weights.specs = reader->header().Specs();
  int64_t bytes = 0;
  for (const TensorSpec& spec : weights.specs) {
    if (absl::Status shape = ValidateShape(spec.shape); !shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", spec.name, "\": ", shape.message()));
    }
    bytes += spec.num_bytes();
  }
  if (bytes > max_model_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds a model of ", bytes, " bytes, more than ",
                                                   max_model_bytes, " (summa-server --max_model_bytes)"));
  }
  if (absl::Status map = PartitionMap::Create(weights.specs, partition_bytes).status(); !map.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a model: ", map.message()));
  }
  SUMMA_ASSIGN_OR_RETURN(weights.flat, reader->ReadAllFloat32());
  return weights;
}

absl::Status CheckExportName(const std::string& file_name) {
  if (file_name.find('/') != std::string::npos || file_name == "." || file_name == ".." ||
      file_name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the export's file name \"", file_name,
        "\" is not a plain name: the server writes into its own --export_dir, and a caller names only the file"));
  }
  return absl::OkStatus();
}

std::string DefaultExportName(uint64_t version) { return absl::StrCat("model-", version, ".safetensors"); }

SafetensorsMetadata ExportMetadata(const JobDescription& job, uint64_t version, absl::Time created,
                                   const std::string& source) {
  return {
      {"format", "pt"},
      {"summa.step", absl::StrCat(version)},
      {"summa.mode", JobModeName(job.mode, job.sync_every)},
      {"summa.world_size", absl::StrCat(job.world_size)},
      {"summa.optimizer", job.optimizer},
      {"summa.partition_bytes", absl::StrCat(job.partition_bytes)},
      {"summa.created", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", created, absl::UTCTimeZone())},
      {"summa.source", source},
  };
}

absl::StatusOr<ExportedModel> ExportCheckpointWeights(absl::Span<const CheckpointHeader> headers,
                                                      absl::Span<PartitionSource* const> sources,
                                                      const std::string& path, const std::string& source) {
  if (headers.empty() || headers.size() != sources.size()) {
    return absl::InvalidArgumentError("an export needs one source of partitions per checkpoint");
  }
  const CheckpointHeader& first = headers.front();
  std::vector<float> flat(static_cast<size_t>(first.map.num_elements()));
  for (size_t i = 0; i < headers.size(); ++i) {
    const CheckpointHeader& h = headers[i];
    // DecodePartitions checks that the partitions are exactly h.held, in order: a set's headers
    // hold every partition once between them.
    SUMMA_RETURN_IF_ERROR(DecodePartitions(h, *sources[i], [&](PartitionSnapshot snap) {
      const PartitionRange& r = h.map.partitions()[snap.id];
      std::copy(snap.weights.begin(), snap.weights.end(), flat.begin() + r.offset);
      return absl::OkStatus();
    }));
    // The tables' rows are not exported; read through, they check the file to its CRC.
    SUMMA_RETURN_IF_ERROR(DecodeTables(
        h, *sources[i], [](int, const TableState&) { return absl::OkStatus(); },
        [](int, const TableRows&) { return absl::OkStatus(); }));
  }
  const SafetensorsMetadata metadata = ExportMetadata(first.job, first.version, first.created, source);
  SUMMA_ASSIGN_OR_RETURN(const uint64_t bytes, WriteSafetensors(path, first.map.specs(), flat, metadata));
  return ExportedModel{path, first.version, static_cast<int>(first.map.specs().size()), bytes};
}

}  // namespace summa::server
