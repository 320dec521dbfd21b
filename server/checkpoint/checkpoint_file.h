// The checkpoint file format: a magic, the body's length, one summa.v1.Checkpoint message as the
// body, and a CRC-32 of everything before it. The body is written and read a partition at a time
// (CheckpointWriter, CheckpointReader): the header's fields, then each partition as its own record
// of field `partitions`. So a model of any size checkpoints (protobuf parses no message over 2 GiB
// whole; a partition is far below that), and neither side holds a second copy of the model. A body
// under 2 GiB still parses whole as a Checkpoint, and a file written whole (the first releases)
// still reads. The file appears atomically (common/atomic_file.h). The classes are not
// thread-safe. What the messages mean is server/core/checkpoint_codec.h's; which files a
// directory keeps is checkpoint_dir.h's.
#ifndef SUMMA_SERVER_CHECKPOINT_CHECKPOINT_FILE_H_
#define SUMMA_SERVER_CHECKPOINT_CHECKPOINT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/atomic_file.h"
#include "summa/v1/checkpoint.pb.h"

namespace summa::server {

// A checkpoint's partitions, one at a time, in the order stored.
class PartitionSource {
 public:
  virtual ~PartitionSource() = default;
  // Sets `*out` to the next partition and returns true, or returns false after the last one (a
  // file checks its length and CRC then). DATA_LOSS for a torn or corrupt file.
  virtual absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) = 0;
};

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
  CheckpointWriter(std::string dir, std::unique_ptr<AtomicFile> file);
  absl::Status Write(const google::protobuf::MessageLite& message, bool as_partition);

  const std::string dir_;
  std::unique_ptr<AtomicFile> file_;
  std::unique_ptr<Sink> sink_;  // the body's bytes: to the file, through the CRC
  bool finished_ = false;  // the body's bytes: to the file, through the CRC
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

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_CHECKPOINT_FILE_H_
