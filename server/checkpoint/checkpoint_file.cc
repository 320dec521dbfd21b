#include "server/checkpoint/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/checkpoint/checkpoint_dir.h"

namespace summa::server {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr char kMagic[] = "SUMMACK1";
constexpr size_t kMagicSize = 8;
constexpr size_t kPrefixSize = kMagicSize + 8;  // magic, body length
constexpr size_t kTrailerSize = 4;              // CRC-32 of everything before it
constexpr size_t kWriteBlockBytes = size_t{1} << 20;

// Field `partitions` of Checkpoint: each partition is one record with this tag.
const uint32_t kPartitionTag = WireFormatLite::MakeTag(summa::v1::Checkpoint::kPartitionsFieldNumber,
                                                       WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
// Field `table_records`: each of the embedding tables' records, after the partitions.
const uint32_t kTableTag = WireFormatLite::MakeTag(summa::v1::Checkpoint::kTableRecordsFieldNumber,
                                                   WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// Reads exactly `size` bytes at `offset`; false on an error or an early end of file.
bool PreadAll(int fd, char* out, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

void AppendLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

uLong Crc(uLong crc, const void* data, size_t size) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // crc32 takes a uInt length
    const uInt n = static_cast<uInt>(std::min<size_t>(size, UINT_MAX));
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return crc;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CheckpointWriter

// The body's bytes on their way to the file: counted and added to the CRC as they are written.
class CheckpointWriter::Sink : public google::protobuf::io::CopyingOutputStream {
 public:
  explicit Sink(AtomicFile* file) : file_(file), stream_(this, kWriteBlockBytes) {}

  bool Write(const void* data, int size) override {
    crc_ = Crc(crc_, data, size);
    bytes_ += size;
    status_ = file_->Append(data, size);
    return status_.ok();
  }

  google::protobuf::io::ZeroCopyOutputStream* stream() { return &stream_; }
  // Writes out what the stream buffers.
  absl::Status Flush() {
    if (!stream_.Flush() && status_.ok()) status_ = absl::InternalError("write " + file_->temp_path());
    return status_;
  }
  absl::Status status() const { return status_; }
  uLong crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  AtomicFile* const file_;  // Not owned.
  uLong crc_ = crc32(0L, Z_NULL, 0);
  uint64_t bytes_ = 0;
  absl::Status status_;
  google::protobuf::io::CopyingOutputStreamAdaptor stream_;  // last: its destructor writes through us
};

CheckpointWriter::CheckpointWriter(std::string dir, std::unique_ptr<AtomicFile> file)
    : dir_(std::move(dir)), file_(std::move(file)), sink_(std::make_unique<Sink>(file_.get())) {}

CheckpointWriter::~CheckpointWriter() {
  sink_.reset();  // before the file: the stream's destructor writes through it
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(const std::string& dir,
                                                                          const summa::v1::Checkpoint& header) {
  if (header.partitions_size() != 0 || header.table_records_size() != 0) {
    return absl::InvalidArgumentError(
        "a checkpoint's header holds no partitions and no table records: append them one at a time");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(CheckpointPath(dir, header.version())));
  // The length is not known yet: Finish writes it over the zeros.
  std::string prefix(kMagic, kMagicSize);
  AppendLe(prefix, 0, 8);
  SUMMA_RETURN_IF_ERROR(file->Append(prefix));
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(dir, std::move(file)));
  SUMMA_RETURN_IF_ERROR(writer->Write(header, /*tag=*/0));
  return writer;
}

absl::Status CheckpointWriter::Write(const google::protobuf::MessageLite& message, uint32_t tag) {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("a checkpoint record of ", size, " bytes is over protobuf's 2 GiB"));
  }
  {
    google::protobuf::io::CodedOutputStream out(sink_->stream());
    if (tag != 0) {
      out.WriteTag(tag);
      out.WriteVarint64(size);
    }
    message.SerializeWithCachedSizes(&out);
    out.Trim();
    if (out.HadError() && sink_->status().ok()) return absl::InternalError("cannot encode a checkpoint record");
  }
  return sink_->status();
}

absl::Status CheckpointWriter::Append(const summa::v1::PartitionCheckpoint& partition) {
  if (tables_started_) return absl::FailedPreconditionError("a checkpoint's partitions come before its tables' records");
  return Write(partition, kPartitionTag);
}

absl::Status CheckpointWriter::AppendTable(const summa::v1::TableRecord& record) {
  tables_started_ = true;
  return Write(record, kTableTag);
}

absl::StatusOr<std::string> CheckpointWriter::Finish(int keep) {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  SUMMA_RETURN_IF_ERROR(sink_->Flush());
  // The CRC covers the prefix, written last, and the body, summed as it went out.
  std::string prefix(kMagic, kMagicSize);
  AppendLe(prefix, sink_->bytes(), 8);
  const uLong crc = crc32_combine(Crc(crc32(0L, Z_NULL, 0), prefix.data(), prefix.size()), sink_->crc(),
                                  static_cast<z_off_t>(sink_->bytes()));
  std::string trailer;
  AppendLe(trailer, crc, kTrailerSize);
  SUMMA_RETURN_IF_ERROR(file_->WriteAt(absl::string_view(prefix).substr(kMagicSize), kMagicSize));
  SUMMA_RETURN_IF_ERROR(file_->WriteAt(trailer, kPrefixSize + sink_->bytes()));
  sink_.reset();
  finished_ = true;
  // On failure the file's destructor removes the temporary file.
  SUMMA_RETURN_IF_ERROR(file_->Commit());
  KeepNewestCheckpoints(dir_, keep);
  return file_->path();
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader

// The body as a stream, read from the file a block at a time; every byte is added to the CRC
// once, as it is read, whatever the parser backs up and reads again.
class CheckpointReader::Body : public google::protobuf::io::ZeroCopyInputStream {
 public:
  Body(int fd, uint64_t length, size_t block_bytes, uLong crc)
      : fd_(fd), left_(length), buffer_(std::max<size_t>(block_bytes, 1)), crc_(crc) {}

  bool Next(const void** data, int* size) override {
    if (pos_ == filled_ && !Fill()) return false;
    *data = buffer_.data() + pos_;
    *size = static_cast<int>(filled_ - pos_);
    count_ += *size;
    pos_ = filled_;
    return true;
  }
  void BackUp(int count) override {
    pos_ -= count;
    count_ -= count;
  }
  bool Skip(int count) override {
    while (count > 0) {
      const void* data;
      int size;
      if (!Next(&data, &size)) return false;
      if (size > count) BackUp(size - count);
      count -= std::min(size, count);
    }
    return true;
  }
  int64_t ByteCount() const override { return count_; }

  bool AtEnd() const { return pos_ == filled_ && left_ == 0; }
  // Reads to the end of the body; false when the file ends early or cannot be read.
  bool Drain() {
    pos_ = filled_;
    while (left_ > 0) {
      if (!Fill()) return false;
      pos_ = filled_;
    }
    return true;
  }
  uLong crc() const { return crc_; }
  const std::string& error() const { return error_; }

 private:
  bool Fill() {
    if (left_ == 0 || !error_.empty()) return false;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer_.size(), left_));
    size_t got = 0;
    while (got < want) {
      const ssize_t n = ::read(fd_, buffer_.data() + got, want - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error_ = absl::StrCat("read: ", std::strerror(errno));
        return false;
      }
      if (n == 0) {
        error_ = "torn: the file ended inside its body";
        return false;
      }
      got += n;
    }
    crc_ = Crc(crc_, buffer_.data(), got);
    left_ -= got;
    pos_ = 0;
    filled_ = got;
    return true;
  }

  const int fd_;
  uint64_t left_;  // body bytes not yet read from the file
  std::vector<char> buffer_;
  size_t pos_ = 0;
  size_t filled_ = 0;
  int64_t count_ = 0;
  uLong crc_;
  std::string error_;
};

CheckpointReader::CheckpointReader(std::string path, int fd, uint64_t length)
    : path_(std::move(path)), fd_(fd), length_(length) {}

CheckpointReader::~CheckpointReader() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path,
                                                                        size_t block_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  struct stat st;
  char prefix[kPrefixSize];
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kPrefixSize + kTrailerSize) ||
      !PreadAll(fd, prefix, kPrefixSize, 0) || std::memcmp(prefix, kMagic, kMagicSize) != 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": not a Summa checkpoint (bad magic or too short)"));
  }
  const uint64_t length = ReadLe(prefix + kMagicSize, 8);
  const uint64_t holds = static_cast<uint64_t>(st.st_size) - kPrefixSize - kTrailerSize;
  if (length != holds) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": torn: header promises ", length, " bytes, file holds ", holds));
  }
  if (::lseek(fd, kPrefixSize, SEEK_SET) != static_cast<off_t>(kPrefixSize)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot seek: ", std::strerror(errno)));
  }
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader(path, fd, length));
  reader->body_ = std::make_unique<Body>(fd, length, block_bytes, Crc(crc32(0L, Z_NULL, 0), prefix, kPrefixSize));
  SUMMA_RETURN_IF_ERROR(reader->ReadHeader());
  return reader;
}

absl::Status CheckpointReader::Fail(const std::string& why) {
  if (!status_.ok()) return status_;
  // A corrupt byte shows first as whatever it broke; the checksum names the cause.
  if (body_->Drain()) {
    const absl::Status whole = CheckTrailer();
    if (!whole.ok()) return whole;
  } else {
    status_ = absl::DataLossError(absl::StrCat(path_, ": ", body_->error()));
    return status_;
  }
  status_ = absl::DataLossError(absl::StrCat(path_, ": ", why));
  return status_;
}

absl::Status CheckpointReader::CheckTrailer() {
  char trailer[kTrailerSize];
  if (!PreadAll(fd_, trailer, kTrailerSize, kPrefixSize + length_)) {
    status_ = absl::DataLossError(absl::StrCat(path_, ": torn: no checksum"));
  } else if (ReadLe(trailer, kTrailerSize) != body_->crc()) {
    status_ = absl::DataLossError(absl::StrCat(path_, ": checksum mismatch"));
  }
  return status_;
}

absl::StatusOr<uint32_t> CheckpointReader::NextTag() {
  if (pending_tag_ != 0) {
    const uint32_t tag = pending_tag_;
    pending_tag_ = 0;
    return tag;
  }
  if (body_->AtEnd()) return 0;
  google::protobuf::io::CodedInputStream in(body_.get());
  const uint32_t tag = in.ReadTag();
  if (tag != 0) return tag;
  if (!body_->error().empty()) return Fail(body_->error());
  return Fail("cannot parse: a record without a tag");
}

absl::Status CheckpointReader::ReadHeader() {
  // The header's fields, kept as they are encoded and parsed together.
  std::string fields;
  {
    google::protobuf::io::StringOutputStream kept_stream(&fields);
    google::protobuf::io::CodedOutputStream kept(&kept_stream);
    while (true) {
      SUMMA_ASSIGN_OR_RETURN(const uint32_t tag, NextTag());
      if (tag == 0) break;
      if (tag == kPartitionTag || tag == kTableTag) {
        pending_tag_ = tag;
        break;
      }
      google::protobuf::io::CodedInputStream in(body_.get());
      if (!WireFormatLite::SkipField(&in, tag, &kept)) return Fail("cannot parse the header");
    }
  }
  if (!header_.ParseFromString(fields)) return Fail("cannot parse the header");
  return absl::OkStatus();
}

absl::Status CheckpointReader::ParseRecord(google::protobuf::MessageLite* out, const char* what) {
  // A stream of its own per record: protobuf counts at most 2 GiB through one, and the body may
  // hold more.
  google::protobuf::io::CodedInputStream in(body_.get());
  uint64_t length;
  if (!in.ReadVarint64(&length) || length > static_cast<uint64_t>(INT_MAX)) {
    return Fail(absl::StrCat("cannot parse: a ", what, " record's length"));
  }
  const google::protobuf::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  if (!out->ParseFromCodedStream(&in) || in.BytesUntilLimit() != 0) {
    return Fail(body_->error().empty() ? absl::StrCat("cannot parse a ", what, " record") : body_->error());
  }
  in.PopLimit(limit);
  return absl::OkStatus();
}

absl::Status CheckpointReader::SkipUnknown(uint32_t tag) {
  // Past the header: a field a later release added is skipped; one of the header's would be
  // read as something it is not.
  const int number = WireFormatLite::GetTagFieldNumber(tag);
  if (summa::v1::Checkpoint::descriptor()->FindFieldByNumber(number) != nullptr) {
    return Fail(absl::StrCat("cannot parse: field ", number, " of the header after the partitions"));
  }
  google::protobuf::io::CodedInputStream in(body_.get());
  if (!WireFormatLite::SkipField(&in, tag)) return Fail("cannot parse a record after the partitions");
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckpointReader::Next(summa::v1::PartitionCheckpoint* out) {
  if (!status_.ok()) return status_;
  // After Verify nothing is left to read: the end must not pass for the end of the partitions.
  if (verified_ && !done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": read to its end by Verify"));
  while (!done_ && !at_tables_) {
    SUMMA_ASSIGN_OR_RETURN(const uint32_t tag, NextTag());
    if (tag == 0) {
      SUMMA_RETURN_IF_ERROR(CheckTrailer());
      done_ = true;
      break;
    }
    if (tag == kPartitionTag) {
      SUMMA_RETURN_IF_ERROR(ParseRecord(out, "partition"));
      return true;
    }
    if (tag == kTableTag) {
      // The partitions end here; NextTable reads on (and checks the file at its end).
      pending_tag_ = tag;
      at_tables_ = true;
      break;
    }
    SUMMA_RETURN_IF_ERROR(SkipUnknown(tag));
  }
  return false;
}

absl::StatusOr<bool> CheckpointReader::NextTable(summa::v1::TableRecord* out) {
  if (!status_.ok()) return status_;
  if (verified_ && !done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": read to its end by Verify"));
  while (!done_) {
    SUMMA_ASSIGN_OR_RETURN(const uint32_t tag, NextTag());
    if (tag == 0) {
      SUMMA_RETURN_IF_ERROR(CheckTrailer());
      done_ = true;
      break;
    }
    if (tag == kTableTag) {
      at_tables_ = true;
      SUMMA_RETURN_IF_ERROR(ParseRecord(out, "table"));
      return true;
    }
    if (tag == kPartitionTag) {
      if (at_tables_) return Fail("cannot parse: a partition after the tables' records");
      // Partitions the caller did not read: skipped unparsed (their bytes still go through the CRC).
      google::protobuf::io::CodedInputStream in(body_.get());
      if (!WireFormatLite::SkipField(&in, tag)) return Fail("cannot parse a partition record");
      continue;
    }
    SUMMA_RETURN_IF_ERROR(SkipUnknown(tag));
  }
  return false;
}

absl::Status CheckpointReader::Verify() {
  if (!status_.ok() || done_ || verified_) return status_;
  verified_ = true;
  if (!body_->Drain()) {
    status_ = absl::DataLossError(absl::StrCat(path_, ": ", body_->error()));
    return status_;
  }
  return CheckTrailer();
}

}  // namespace summa::server
