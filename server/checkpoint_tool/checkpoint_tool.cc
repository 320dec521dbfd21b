#include "server/checkpoint_tool/checkpoint_tool.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/checkpoint/checkpoint_file.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/model_export.h"

namespace summa::server {
namespace {

using Readers = absl::Span<CheckpointReader* const>;

// The headers of one checkpoint or of a set (shard order), decoded against the job the first
// records (nothing else to hold them to).
absl::StatusOr<std::vector<CheckpointHeader>> Decode(Readers readers) {
  SUMMA_ASSIGN_OR_RETURN(const JobDescription job, CheckpointJob(readers.front()->header()));
  if (readers.size() == 1) {
    SUMMA_ASSIGN_OR_RETURN(CheckpointHeader h, DecodeCheckpointHeader(readers.front()->header(), job));
    return std::vector<CheckpointHeader>{std::move(h)};
  }
  std::vector<const summa::v1::Checkpoint*> set;
  for (CheckpointReader* reader : readers) set.push_back(&reader->header());
  return DecodeCheckpointSet(set, job);
}

void Print(Readers readers, const std::vector<CheckpointHeader>& headers, bool tensors, std::ostream& out) {
  const CheckpointHeader& first = headers.front();
  const JobDescription& job = first.job;
  int64_t parameters = first.map.num_elements();
  for (size_t i = 0; i < headers.size(); ++i) {
    const CheckpointHeader& h = headers[i];
    int64_t held = 0;
    for (const PartitionRange& r : h.held) held += r.length;
    out << "checkpoint " << readers[i]->path() << "\n"
        << "  shard:      " << h.job.shard << " of " << h.job.shards << " (" << h.held.size() << " of "
        << h.map.partitions().size() << " partitions, " << held << " of " << parameters << " parameters)\n";
  }
  out << "  job:        " << job.world_size << " workers, " << JobModeName(job.mode, job.sync_every) << " mode"
      << (job.sync_every > 0 ? absl::StrCat(" (", job.sync_every, " local steps between exchanges; the outer optimizer)") : "")
      << ", optimizer "
      << job.optimizer << " (state: " << (job.slot_names.empty() ? "none" : absl::StrJoin(job.slot_names, ", "))
      << "), partitions of " << job.partition_bytes << " bytes\n"
      << "  version:    " << first.version << (job.sync_every > 0 ? " (outer steps completed)\n" : " (steps completed)\n")
      << "  created:    " << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", first.created, absl::UTCTimeZone()) << "\n";
  const summa::v1::Checkpoint& c = readers.front()->header();
  if (c.has_group()) {
    out << "  group:      view " << c.group().view() << ", ranks [" << absl::StrJoin(c.group().ranks(), ", ")
        << "]\n";
  } else {
    out << "  group:      every rank\n";
  }
  out << "  tensors:    " << first.map.specs().size() << " (" << parameters << " parameters, "
      << parameters * 4 << " bytes of float32)\n";
  if (!tensors) return;
  for (const TensorSpec& spec : first.map.specs()) out << "    " << spec.name << " " << ShapeString(spec.shape) << "\n";
}

// What a checkpoint (or a set) holds of one embedding table: its rows on every shard, and the
// versions its shards' tables are at.
struct TableSummary {
  uint64_t rows = 0;
  uint64_t waiting = 0;  // ids waiting for admission
  uint64_t low = UINT64_MAX;
  uint64_t high = 0;
};

// Reads every table record of `readers` (each file to its end, which checks it) and sums them up.
absl::StatusOr<std::vector<TableSummary>> ReadTables(Readers readers, const std::vector<CheckpointHeader>& headers) {
  std::vector<TableSummary> tables(headers.front().tables.size());
  for (size_t i = 0; i < readers.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(DecodeTables(
        headers[i], *readers[i],
        [&](int t, const TableState& state) {
          TableSummary& s = tables[t];
          s.rows += state.rows;
          s.waiting += state.waiting_ids.size();
          s.low = std::min(s.low, state.version);
          s.high = std::max(s.high, state.version);
          return absl::OkStatus();
        },
        [](int, const TableRows&) { return absl::OkStatus(); }));
  }
  return tables;
}

void PrintTables(const std::vector<CheckpointHeader>& headers, const std::vector<TableSummary>& tables,
                 std::ostream& out) {
  if (tables.empty()) return;
  uint64_t rows = 0;
  for (const TableSummary& t : tables) rows += t.rows;
  out << "  tables:     " << tables.size() << " embedding table" << (tables.size() == 1 ? "" : "s") << " (" << rows
      << " rows)\n";
  for (size_t i = 0; i < tables.size(); ++i) {
    const summa::v1::EmbeddingTableSpec& spec = headers.front().tables[i].spec;
    const TableSummary& t = tables[i];
    out << "    " << spec.name() << ": dim " << spec.dim() << ", " << spec.optimizer().name() << ", " << t.rows
        << " rows, version " << (t.low == t.high ? absl::StrCat(t.low) : absl::StrCat(t.low, " to ", t.high))
        << (t.waiting > 0 ? absl::StrCat(", ", t.waiting, " ids waiting for admission") : "") << "\n";
  }
}

// Hands CKPT's readers to `use`: a file's alone, or a directory's newest whole checkpoint (one
// server's or a set's), skipping torn files with a line on `out`.
absl::Status WithCheckpoint(const std::string& ckpt, std::ostream& out, absl::FunctionRef<absl::Status(Readers)> use) {
  std::error_code error;
  if (!std::filesystem::is_directory(ckpt, error)) {
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(ckpt));
    CheckpointReader* readers[] = {reader.get()};
    return use(readers);
  }
  std::vector<std::string> warnings;
  absl::StatusOr<std::optional<RestoredCheckpoint>> read = ReadNewestWholeCheckpoint(ckpt, use, &warnings);
  for (const std::string& w : warnings) out << "summa-checkpoint: " << w << "\n";
  if (!read.ok()) return read.status();
  if (!read->has_value()) {
    return absl::NotFoundError(absl::StrCat(
        ckpt, " holds no whole checkpoint (ckpt-*.summa files, or shard-I-of-K directories of them, every shard "
              "keeping one version)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShowCheckpoint(const std::string& ckpt, bool tensors, std::ostream& out) {
  return WithCheckpoint(ckpt, out, [&](Readers readers) -> absl::Status {
    SUMMA_ASSIGN_OR_RETURN(const std::vector<CheckpointHeader> headers, Decode(readers));
    Print(readers, headers, tensors, out);
    // A directory's checkpoint is shown once it is known whole; a file's header alone is shown.
    // Reading the tables' records reads every file to its end, which checks it.
    SUMMA_ASSIGN_OR_RETURN(const std::vector<TableSummary> tables, ReadTables(readers, headers));
    PrintTables(headers, tables, out);
    return absl::OkStatus();
  });
}

absl::Status ExportCheckpoint(const std::string& ckpt, const std::string& out_path, std::ostream& out) {
  return WithCheckpoint(ckpt, out, [&](Readers readers) -> absl::Status {
    SUMMA_ASSIGN_OR_RETURN(const std::vector<CheckpointHeader> headers, Decode(readers));
    const JobDescription& job = headers.front().job;
    if (headers.size() == 1 && job.shards > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          readers.front()->path(), " is shard ", job.shard, " of ", job.shards,
          "'s checkpoint and holds only its partitions: give the job's checkpoint directory (the one holding "
          "shard-I-of-", job.shards, "/) to assemble every shard's checkpoint of one version"));
    }
    Print(readers, headers, /*tensors=*/false, out);
    std::vector<PartitionSource*> sources(readers.begin(), readers.end());
    SUMMA_ASSIGN_OR_RETURN(const ExportedModel exported,
                           ExportCheckpointWeights(headers, sources, out_path, readers.front()->path()));
    out << "wrote " << exported.path << ": version " << exported.version << ", " << exported.tensors << " tensors, "
        << exported.bytes << " bytes (safetensors, F32)\n";
    if (const size_t tables = headers.front().tables.size(); tables > 0) {
      out << "the checkpoint's " << tables << " embedding table" << (tables == 1 ? "" : "s")
          << " not exported: their rows stay in the checkpoint\n";
    }
    return absl::OkStatus();
  });
}

}  // namespace summa::server
