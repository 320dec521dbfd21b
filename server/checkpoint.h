// Checkpoints of the server's state: every partition's master weights, optimizer state slots,
// version and pushes seen, with the job's description; encoded from and decoded into plain
// snapshots (a restore into a job that differs is refused, naming both sides), written
// atomically (temporary file, fsync, rename, directory fsync) with a CRC, and restored from the
// newest file that is whole.
//
// A file's body is one summa.v1.Checkpoint message, but it is written and read a partition at a
// time (CheckpointWriter, CheckpointReader): the header's fields, then each partition as its own
// record of field `partitions`. So a model of any size checkpoints (protobuf parses no message
// over 2 GiB whole; a partition is far below that), and neither side holds a second copy of the
// model. A body under 2 GiB still parses whole as a Checkpoint, and a file written whole (the
// first releases) still reads. Free functions are thread-safe; the classes are not.
#ifndef SUMMA_SERVER_CHECKPOINT_H_
#define SUMMA_SERVER_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/partition_map.h"
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
};

struct ServerSnapshot {
  JobDescription job;
  std::vector<TensorSpec> specs;
  std::vector<PartitionSnapshot> partitions;
  absl::Time created = absl::InfinitePast();
  // The lowest partition version.
  uint64_t version() const;
};

// Everything in a checkpoint but its partitions. `version`: no partition is below it (in sync
// mode every partition is at it).
summa::v1::Checkpoint EncodeCheckpointHeader(const JobDescription& job, const std::vector<TensorSpec>& specs,
                                             uint64_t version, absl::Time created);
summa::v1::PartitionCheckpoint EncodePartition(const PartitionSnapshot& partition);

// A checkpoint's partitions, one at a time, in the order stored.
class PartitionSource {
 public:
  virtual ~PartitionSource() = default;
  // Sets `*out` to the next partition and returns true, or returns false after the last one (a
  // file checks its length and CRC then). DATA_LOSS for a torn or corrupt file.
  virtual absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) = 0;
};

// A checkpoint's header, decoded and checked against this server's job.
struct CheckpointHeader {
  JobDescription job;  // the checkpoint's; differs from ours in `optimizer` at most
  PartitionMap map;    // the model's tensors and partitions
  std::vector<PartitionRange> held;  // the partitions the checkpoint must hold: its shard's
  uint64_t version = 0;
  absl::Time created = absl::InfinitePast();
};

// FAILED_PRECONDITION naming both sides when the checkpoint's job differs from `ours`;
// DATA_LOSS when the header is malformed.
absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(const summa::v1::Checkpoint& header,
                                                        const JobDescription& ours);

// Reads every partition of `source`, checks it against `header` and hands it to `take` before
// reading the next. DATA_LOSS when the partitions do not tile the model (in id order), or a sync
// checkpoint's are not all at its version; the source's error when it fails; `take`'s when it
// does (nothing more is read).
absl::Status DecodePartitions(const CheckpointHeader& header, PartitionSource& source,
                              absl::FunctionRef<absl::Status(PartitionSnapshot)> take);

// The whole checkpoint as one message and back, in memory: for small checkpoints and tests.
// Files go through CheckpointWriter and CheckpointReader.
summa::v1::Checkpoint EncodeCheckpoint(const ServerSnapshot& snapshot);
absl::StatusOr<ServerSnapshot> DecodeCheckpoint(const summa::v1::Checkpoint& checkpoint,
                                                const JobDescription& ours);

// Writes one checkpoint file, <dir>/ckpt-<version>.summa, a partition at a time: each Append
// goes to the file before it returns, so the writer holds one partition's encoding at most.
// The file appears (atomically) only on Finish; a writer destroyed before that removes its
// temporary file.
class CheckpointWriter {
 public:
  // Starts the file with `header`, which must hold no partitions. INTERNAL when the directory
  // or the file cannot be created.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(const std::string& dir,
                                                                  const summa::v1::Checkpoint& header);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  absl::Status Append(const summa::v1::PartitionCheckpoint& partition);

  // Completes the file (length, CRC, fsync, rename, directory fsync) and removes all but the
  // newest `keep` checkpoints in the directory. Returns the path written.
  absl::StatusOr<std::string> Finish(int keep = 2);

 private:
  class Sink;
  CheckpointWriter(std::string dir, std::string path, int fd);
  absl::Status Write(const google::protobuf::MessageLite& message, bool as_partition);

  const std::string dir_;
  const std::string path_;
  const std::string tmp_;
  int fd_;  // -1 once finished
  std::unique_ptr<Sink> sink_;  // the body's bytes: to the file, through the CRC
};

// Reads one checkpoint file as a stream: the header at once, then the partitions one at a time,
// parsed each on its own; the CRC is checked as the last one is read.
class CheckpointReader : public PartitionSource {
 public:
  // NOT_FOUND when `path` cannot be opened; DATA_LOSS when its size, magic or header show it is
  // not a whole checkpoint file. `block_bytes`: the size of each read.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path,
                                                                size_t block_bytes = size_t{1} << 20);
  ~CheckpointReader() override;
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  // Every field but the partitions.
  const summa::v1::Checkpoint& header() const { return header_; }

  // DATA_LOSS for a torn or corrupt file; once it fails, it fails the same way.
  absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) override;

  // Reads the rest of the file without decoding it: OK when the file is whole. This tells a
  // file that is corrupt from one that is whole but refused.
  absl::Status Verify();

 private:
  class Body;
  CheckpointReader(std::string path, int fd, uint64_t length);
  absl::Status ReadHeader();
  // The next record's tag, or 0 at the end of the body.
  absl::StatusOr<uint32_t> NextTag();
  absl::Status ParsePartition(summa::v1::PartitionCheckpoint* out);
  absl::Status CheckTrailer();
  absl::Status Fail(const std::string& why);

  const std::string path_;
  const int fd_;
  const uint64_t length_;
  std::unique_ptr<Body> body_;
  summa::v1::Checkpoint header_;
  bool partition_pending_ = false;  // the header ended at a partition's tag, already read
  bool done_ = false;               // every partition was read and the CRC matched
  bool verified_ = false;           // Verify read the rest
  absl::Status status_;
};

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

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_H_
