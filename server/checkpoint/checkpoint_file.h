// The checkpoint file format: a magic, the body's length, one summa.v1.Checkpoint message as the
// body, and a CRC-32 of everything before it. The body is written and read a record at a time
// (CheckpointWriter, CheckpointReader): the header's fields, then each partition as its own record
// of field `partitions`, then each embedding table's state and chunks of rows as records of field
// `table_records`. So a model of any size checkpoints (protobuf parses no message over 2 GiB
// whole; a record is far below that), and neither side holds a second copy of the model. A body
// under 2 GiB still parses whole as a Checkpoint, a file written whole (the first releases) still
// reads, and a reader that knows no tables skips their records (unknown fields after the
// partitions). The file appears atomically (common/atomic_file.h). The classes are not
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

// A checkpoint's partitions, one at a time, in the order stored, and then its embedding tables'
// records.
class PartitionSource {
 public:
  virtual ~PartitionSource() = default;
  // Sets `*out` to the next partition and returns true, or returns false after the last one (a
  // file checks its length and CRC then, unless table records follow: NextTable reads them and
  // checks it after the last). DATA_LOSS for a torn or corrupt file.
  virtual absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) = 0;
  // Sets `*out` to the next table record (partitions not read are skipped) and returns true, or
  // returns false after the last one (a file checks its length and CRC then). A source of a
  // checkpoint without tables has none.
  virtual absl::StatusOr<bool> NextTable(summa::v1::TableRecord* out) { return false; }
};

// Writes one checkpoint file, <dir>/ckpt-<version>.summa, a record at a time: each Append goes to
// the file before it returns, so the writer holds one record's encoding at most.
// The file appears (atomically) only on Finish; a writer destroyed before that removes its
// temporary file.
class CheckpointWriter {
 public:
  // Starts the file with `header`, which must hold no partitions and no table records. INTERNAL
  // when the directory or the file cannot be created.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(const std::string& dir,
                                                                  const summa::v1::Checkpoint& header);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Every partition, then the tables' records: FAILED_PRECONDITION for a partition after them.
  absl::Status Append(const summa::v1::PartitionCheckpoint& partition);
  absl::Status AppendTable(const summa::v1::TableRecord& record);

  // Completes the file (length, CRC, fsync, rename, directory fsync) and removes all but the
  // newest `keep` checkpoints in the directory. Returns the path written.
  absl::StatusOr<std::string> Finish(int keep = 2);

 private:
  class Sink;
  CheckpointWriter(std::string dir, std::unique_ptr<AtomicFile> file);
  // `tag`: the record's (a partition's or a table record's), or 0 for the header's fields.
  absl::Status Write(const google::protobuf::MessageLite& message, uint32_t tag);

  const std::string dir_;
  std::unique_ptr<AtomicFile> file_;
  std::unique_ptr<Sink> sink_;  // the body's bytes: to the file, through the CRC
  bool finished_ = false;
  bool tables_started_ = false;  // a table record was written: no partition may follow
};

// Reads one checkpoint file as a stream: the header at once, then the partitions one at a time,
// then the table records, parsed each on its own; the CRC is checked as the last one is read.
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
  // Every field but the partitions and the table records.
  const summa::v1::Checkpoint& header() const { return header_; }

  // DATA_LOSS for a torn or corrupt file (a partition after a table record too); once it fails,
  // it fails the same way.
  absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) override;
  absl::StatusOr<bool> NextTable(summa::v1::TableRecord* out) override;

  // Reads the rest of the file without decoding it: OK when the file is whole. This tells a
  // file that is corrupt from one that is whole but refused.
  absl::Status Verify();

 private:
  class Body;
  CheckpointReader(std::string path, int fd, uint64_t length);
  absl::Status ReadHeader();
  // The next record's tag (one ReadHeader or Next stopped at first), or 0 at the end of the body.
  absl::StatusOr<uint32_t> NextTag();
  // The record after its tag, into `out` (`what` names it in an error).
  absl::Status ParseRecord(google::protobuf::MessageLite* out, const char* what);
  // Skips a record after the header that this release does not know; DATA_LOSS for a field of
  // the header there.
  absl::Status SkipUnknown(uint32_t tag);
  absl::Status CheckTrailer();
  absl::Status Fail(const std::string& why);

  const std::string path_;
  const int fd_;
  const uint64_t length_;
  std::unique_ptr<Body> body_;
  summa::v1::Checkpoint header_;
  uint32_t pending_tag_ = 0;  // a record's tag already read (where the header or the partitions end)
  bool at_tables_ = false;    // the partitions ended at a table record
  bool done_ = false;         // every record was read and the CRC matched
  bool verified_ = false;           // Verify read the rest
  absl::Status status_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CHECKPOINT_CHECKPOINT_FILE_H_
