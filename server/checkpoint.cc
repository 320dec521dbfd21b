#include "server/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

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

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + path);
    }
    p += n;
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status PwriteAll(int fd, const std::string& data, off_t offset, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + path);
    }
    done += n;
  }
  return absl::OkStatus();
}

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

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `bytes` as exactly `n` floats, or DATA_LOSS naming `what`.
absl::StatusOr<std::vector<float>> FloatsOf(const std::string& bytes, int64_t n, const std::string& what) {
  if (static_cast<int64_t>(bytes.size()) != n * 4) {
    return absl::DataLossError(absl::StrCat(what, " holds ", bytes.size(), " bytes; ", n * 4, " expected"));
  }
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::string Describe(const JobDescription& j) {
  return absl::StrCat(j.world_size, " workers, ", ModeName(j.mode), " mode, partitions of ",
                      j.partition_bytes, " bytes, optimizer ", j.optimizer_name, " with state [",
                      absl::StrJoin(j.slot_names, ", "), "]",
                      j.shards > 1 ? absl::StrCat(", shard ", j.shard, " of ", j.shards) : "");
}

absl::StatusOr<PartitionSnapshot> DecodePartition(const CheckpointHeader& h, const PartitionRange& range,
                                                  const summa::v1::PartitionCheckpoint& in) {
  const std::string what = absl::StrCat("partition ", range.id);
  if (in.id() != range.id || in.slots_size() != static_cast<int>(h.job.slot_names.size()) ||
      in.next_steps_size() != h.job.world_size) {
    return absl::DataLossError(absl::StrCat(what, " of the checkpoint is malformed"));
  }
  PartitionSnapshot p;
  p.id = range.id;
  p.version = in.version();
  p.updates = in.updates();
  if (p.updates > p.version) return absl::DataLossError(absl::StrCat(what, " has more updates than steps"));
  if (h.job.mode == Mode::kSync) {
    // A sync checkpoint is taken with every partition at one version, and no rank past it.
    if (in.version() != h.version) {
      return absl::DataLossError(absl::StrCat(what, " is at version ", in.version(),
                                              "; a sync checkpoint's partitions are all at ", h.version));
    }
    for (uint64_t next : in.next_steps()) {
      if (next > in.version()) {
        return absl::DataLossError(absl::StrCat(what, " has a push of step ", next - 1,
                                                " recorded at version ", in.version()));
      }
    }
  }
  SUMMA_ASSIGN_OR_RETURN(p.weights, FloatsOf(in.weights(), range.length, what + "'s weights"));
  for (int i = 0; i < in.slots_size(); ++i) {
    SUMMA_ASSIGN_OR_RETURN(std::vector<float> slot,
                           FloatsOf(in.slots(i), range.length, absl::StrCat(what, "'s ", h.job.slot_names[i])));
    p.slots.push_back(std::move(slot));
  }
  p.next_steps.assign(in.next_steps().begin(), in.next_steps().end());
  return p;
}

// The partitions of a whole Checkpoint message in memory.
class MessagePartitions : public PartitionSource {
 public:
  explicit MessagePartitions(const summa::v1::Checkpoint& c) : c_(c) {}
  absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) override {
    if (next_ == c_.partitions_size()) return false;
    *out = c_.partitions(next_++);
    return true;
  }

 private:
  const summa::v1::Checkpoint& c_;
  int next_ = 0;
};

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && entry.path().extension() == ".summa") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

uint64_t ServerSnapshot::version() const {
  uint64_t low = partitions.empty() ? 0 : UINT64_MAX;
  for (const PartitionSnapshot& p : partitions) low = std::min(low, p.version);
  return low;
}

summa::v1::Checkpoint EncodeCheckpointHeader(const JobDescription& job, const std::vector<TensorSpec>& specs,
                                             uint64_t version, absl::Time created) {
  summa::v1::Checkpoint c;
  c.set_version(version);
  c.set_world_size(job.world_size);
  c.set_mode(ModeToProto(job.mode));
  c.set_partition_bytes(job.partition_bytes);
  c.set_optimizer(job.optimizer);
  c.set_optimizer_name(job.optimizer_name);
  for (const std::string& name : job.slot_names) c.add_slot_names(name);
  if (job.shards > 1) {
    c.set_shard(job.shard);
    c.set_shards(job.shards);
  }
  c.set_created_unix_seconds(absl::ToUnixSeconds(created));
  for (const TensorSpec& spec : specs) SpecToProto(spec, c.add_params());
  return c;
}

summa::v1::PartitionCheckpoint EncodePartition(const PartitionSnapshot& p) {
  summa::v1::PartitionCheckpoint out;
  out.set_id(p.id);
  out.set_version(p.version);
  out.set_updates(p.updates);
  out.set_weights(Floats(p.weights));
  for (const std::vector<float>& slot : p.slots) out.add_slots(Floats(slot));
  for (uint64_t next : p.next_steps) out.add_next_steps(next);
  return out;
}

absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(const summa::v1::Checkpoint& c,
                                                        const JobDescription& ours) {
  CheckpointHeader h;
  JobDescription& theirs = h.job;
  theirs.world_size = c.world_size();
  absl::StatusOr<Mode> mode = ModeFromProto(c.mode());
  if (!mode.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", mode.status().message()));
  theirs.mode = *mode;
  theirs.partition_bytes = c.partition_bytes();
  theirs.optimizer_name = c.optimizer_name();
  theirs.optimizer = c.optimizer();
  theirs.slot_names.assign(c.slot_names().begin(), c.slot_names().end());
  theirs.shard = c.shard();
  theirs.shards = std::max(1, c.shards());
  if (theirs.world_size != ours.world_size || theirs.mode != ours.mode || theirs.shard != ours.shard ||
      theirs.shards != ours.shards ||
      theirs.partition_bytes != ours.partition_bytes || theirs.optimizer_name != ours.optimizer_name ||
      theirs.slot_names != ours.slot_names) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint is of a job of ", Describe(theirs),
                                                      "; this server runs ", Describe(ours)));
  }
  if (theirs.optimizer != ours.optimizer) {
    SUMMA_LOG(WARNING) << "the checkpoint's optimizer was " << theirs.optimizer << "; going on with "
                       << ours.optimizer << " and its state";
  }
  h.version = c.version();
  h.created = absl::FromUnixSeconds(c.created_unix_seconds());
  std::vector<TensorSpec> specs;
  for (const summa::v1::Tensor& t : c.params()) {
    absl::StatusOr<TensorSpec> spec = SpecFromProto(t);
    if (!spec.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", spec.status().message()));
    specs.push_back(*std::move(spec));
  }
  // Counted before the map is built: a header claiming 2^40 floats in 16-byte partitions would
  // be 2^38 partition ranges, whatever the file holds (found by fuzz/checkpoint_fuzzer).
  constexpr int64_t kMaxPartitions = int64_t{1} << 20;
  int64_t elements = 0;
  for (const TensorSpec& spec : specs) {
    elements += spec.num_elements();  // each at most 2^40 (SpecFromProto): no overflow below 2^62
    if (elements > (int64_t{1} << 62)) return absl::DataLossError("the checkpoint's model is too large");
  }
  const int64_t per_partition = std::max<int64_t>(ours.partition_bytes / 4, 1);
  if ((elements + per_partition - 1) / per_partition > kMaxPartitions) {
    return absl::DataLossError(absl::StrCat("the checkpoint's model of ", elements, " parameters would be over ",
                                            kMaxPartitions, " partitions of ", ours.partition_bytes, " bytes"));
  }
  absl::StatusOr<PartitionMap> map = PartitionMap::Create(std::move(specs), ours.partition_bytes);
  if (!map.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's model: ", map.status().message()));
  h.map = *std::move(map);
  const std::vector<int> shard_of = AssignShards(h.map.partitions(), ours.shards);
  for (const PartitionRange& r : h.map.partitions()) {
    if (shard_of[r.id] == ours.shard) h.held.push_back(r);
  }
  return h;
}

absl::Status DecodePartitions(const CheckpointHeader& h, PartitionSource& source,
                              absl::FunctionRef<absl::Status(PartitionSnapshot)> take) {
  const std::vector<PartitionRange>& ranges = h.held;
  summa::v1::PartitionCheckpoint in;
  size_t count = 0;
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, source.Next(&in));
    if (!more) break;
    if (count == ranges.size()) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint holds more partitions than the ", ranges.size(), " of its model"));
    }
    SUMMA_ASSIGN_OR_RETURN(PartitionSnapshot p, DecodePartition(h, ranges[count], in));
    SUMMA_RETURN_IF_ERROR(take(std::move(p)));
    ++count;
  }
  if (count != ranges.size()) {
    return absl::DataLossError(
        absl::StrCat("the checkpoint holds ", count, " partitions; its model has ", ranges.size()));
  }
  return absl::OkStatus();
}

summa::v1::Checkpoint EncodeCheckpoint(const ServerSnapshot& s) {
  summa::v1::Checkpoint c = EncodeCheckpointHeader(s.job, s.specs, s.version(), s.created);
  for (const PartitionSnapshot& p : s.partitions) *c.add_partitions() = EncodePartition(p);
  return c;
}

absl::StatusOr<ServerSnapshot> DecodeCheckpoint(const summa::v1::Checkpoint& c, const JobDescription& ours) {
  SUMMA_ASSIGN_OR_RETURN(CheckpointHeader h, DecodeCheckpointHeader(c, ours));
  ServerSnapshot s;
  MessagePartitions source(c);
  SUMMA_RETURN_IF_ERROR(DecodePartitions(h, source, [&](PartitionSnapshot p) {
    s.partitions.push_back(std::move(p));
    return absl::OkStatus();
  }));
  s.job = std::move(h.job);
  s.specs = h.map.specs();
  s.created = h.created;
  return s;
}

// ---------------------------------------------------------------------------------------------
// CheckpointWriter

// The body's bytes on their way to the file: counted and added to the CRC as they are written.
class CheckpointWriter::Sink : public google::protobuf::io::CopyingOutputStream {
 public:
  Sink(int fd, const std::string& path) : fd_(fd), path_(path), stream_(this, kWriteBlockBytes) {}

  bool Write(const void* data, int size) override {
    crc_ = Crc(crc_, data, size);
    bytes_ += size;
    status_ = WriteAll(fd_, data, size, path_);
    return status_.ok();
  }

  google::protobuf::io::ZeroCopyOutputStream* stream() { return &stream_; }
  // Writes out what the stream buffers.
  absl::Status Flush() {
    if (!stream_.Flush() && status_.ok()) status_ = absl::InternalError("write " + path_);
    return status_;
  }
  absl::Status status() const { return status_; }
  uLong crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const int fd_;
  const std::string path_;
  uLong crc_ = crc32(0L, Z_NULL, 0);
  uint64_t bytes_ = 0;
  absl::Status status_;
  google::protobuf::io::CopyingOutputStreamAdaptor stream_;  // last: its destructor writes through us
};

CheckpointWriter::CheckpointWriter(std::string dir, std::string path, int fd)
    : dir_(std::move(dir)), path_(std::move(path)), tmp_(path_ + ".tmp"), fd_(fd),
      sink_(std::make_unique<Sink>(fd, tmp_)) {}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ < 0) return;
  sink_.reset();
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(const std::string& dir,
                                                                          const summa::v1::Checkpoint& header) {
  if (header.partitions_size() != 0) {
    return absl::InvalidArgumentError("a checkpoint's header holds no partitions: append them one at a time");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string path = CheckpointPath(dir, header.version());
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + tmp);
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(dir, path, fd));
  // The length is not known yet: Finish writes it over the zeros.
  std::string prefix(kMagic, kMagicSize);
  AppendLe(prefix, 0, 8);
  SUMMA_RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), tmp));
  SUMMA_RETURN_IF_ERROR(writer->Write(header, /*as_partition=*/false));
  return writer;
}

absl::Status CheckpointWriter::Write(const google::protobuf::MessageLite& message, bool as_partition) {
  if (fd_ < 0) return absl::FailedPreconditionError("the checkpoint is already finished");
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("a checkpoint record of ", size, " bytes is over protobuf's 2 GiB"));
  }
  {
    google::protobuf::io::CodedOutputStream out(sink_->stream());
    if (as_partition) {
      out.WriteTag(kPartitionTag);
      out.WriteVarint64(size);
    }
    message.SerializeWithCachedSizes(&out);
    out.Trim();
    if (out.HadError() && sink_->status().ok()) return absl::InternalError("cannot encode a checkpoint record");
  }
  return sink_->status();
}

absl::Status CheckpointWriter::Append(const summa::v1::PartitionCheckpoint& partition) {
  return Write(partition, /*as_partition=*/true);
}

absl::StatusOr<std::string> CheckpointWriter::Finish(int keep) {
  if (fd_ < 0) return absl::FailedPreconditionError("the checkpoint is already finished");
  SUMMA_RETURN_IF_ERROR(sink_->Flush());
  // The CRC covers the prefix, written last, and the body, summed as it went out.
  std::string prefix(kMagic, kMagicSize);
  AppendLe(prefix, sink_->bytes(), 8);
  const uLong crc = crc32_combine(Crc(crc32(0L, Z_NULL, 0), prefix.data(), prefix.size()), sink_->crc(),
                                  static_cast<z_off_t>(sink_->bytes()));
  std::string trailer;
  AppendLe(trailer, crc, kTrailerSize);
  absl::Status written = PwriteAll(fd_, prefix.substr(kMagicSize), kMagicSize, tmp_);
  if (written.ok()) written = PwriteAll(fd_, trailer, kPrefixSize + sink_->bytes(), tmp_);
  if (written.ok() && ::fsync(fd_) != 0) written = Errno("fsync " + tmp_);
  if (!written.ok()) return written;  // the destructor removes the temporary file
  sink_.reset();
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const absl::Status renamed = Errno("rename " + tmp_);
    ::unlink(tmp_.c_str());
    return renamed;
  }
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
  // Keep the newest `keep` checkpoints.
  const std::vector<std::string> all = CheckpointFiles(dir_);
  std::error_code ec;
  for (size_t i = 0; i + keep < all.size(); ++i) std::filesystem::remove(all[i], ec);
  return path_;
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
      if (tag == kPartitionTag) {
        partition_pending_ = true;
        break;
      }
      google::protobuf::io::CodedInputStream in(body_.get());
      if (!WireFormatLite::SkipField(&in, tag, &kept)) return Fail("cannot parse the header");
    }
  }
  if (!header_.ParseFromString(fields)) return Fail("cannot parse the header");
  return absl::OkStatus();
}

absl::Status CheckpointReader::ParsePartition(summa::v1::PartitionCheckpoint* out) {
  // A stream of its own per record: protobuf counts at most 2 GiB through one, and the body may
  // hold more.
  google::protobuf::io::CodedInputStream in(body_.get());
  uint64_t length;
  if (!in.ReadVarint64(&length) || length > static_cast<uint64_t>(INT_MAX)) {
    return Fail("cannot parse: a partition record's length");
  }
  const google::protobuf::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  if (!out->ParseFromCodedStream(&in) || in.BytesUntilLimit() != 0) {
    return Fail(body_->error().empty() ? "cannot parse a partition record" : body_->error());
  }
  in.PopLimit(limit);
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckpointReader::Next(summa::v1::PartitionCheckpoint* out) {
  if (!status_.ok()) return status_;
  // After Verify nothing is left to read: the end must not pass for the end of the partitions.
  if (verified_ && !done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": read to its end by Verify"));
  while (!done_) {
    uint32_t tag = kPartitionTag;
    if (partition_pending_) {
      partition_pending_ = false;
    } else {
      SUMMA_ASSIGN_OR_RETURN(tag, NextTag());
    }
    if (tag == 0) {
      SUMMA_RETURN_IF_ERROR(CheckTrailer());
      done_ = true;
      break;
    }
    if (tag == kPartitionTag) {
      SUMMA_RETURN_IF_ERROR(ParsePartition(out));
      return true;
    }
    // Past the header: a field a later release added is skipped; one of the header's would be
    // read as something it is not.
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    if (summa::v1::Checkpoint::descriptor()->FindFieldByNumber(number) != nullptr) {
      return Fail(absl::StrCat("cannot parse: field ", number, " of the header after the partitions"));
    }
    google::protobuf::io::CodedInputStream in(body_.get());
    if (!WireFormatLite::SkipField(&in, tag)) return Fail("cannot parse a record after the partitions");
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

std::string CheckpointPath(const std::string& dir, uint64_t version) {
  return absl::StrFormat("%s/ckpt-%012d.summa", dir, version);
}

std::vector<uint64_t> CheckpointVersions(const std::string& dir) {
  std::vector<uint64_t> versions;
  for (const std::string& path : CheckpointFiles(dir)) {
    const std::string name = std::filesystem::path(path).stem().string();  // ckpt-000000000012
    uint64_t version;
    if (absl::SimpleAtoi(absl::string_view(name).substr(5), &version)) versions.push_back(version);
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

absl::Status RemoveCheckpointsAfter(const std::string& dir, uint64_t version) {
  for (uint64_t v : CheckpointVersions(dir)) {
    if (v <= version) continue;
    std::error_code ec;
    const std::string path = CheckpointPath(dir, v);
    std::filesystem::remove(path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreNewestCheckpoint(
    const std::string& dir, absl::FunctionRef<absl::Status(CheckpointReader&)> restore,
    std::vector<std::string>* warnings) {
  std::vector<std::string> candidates = CheckpointFiles(dir);
  std::reverse(candidates.begin(), candidates.end());
  for (const std::string& path : candidates) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    if (!reader.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", reader.status().message()));
      continue;
    }
    const absl::Status restored = restore(**reader);
    if (restored.ok()) return RestoredCheckpoint{path, (*reader)->header()};
    const absl::Status whole = (*reader)->Verify();
    if (!whole.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", whole.message()));
      continue;
    }
    return absl::Status(restored.code(), absl::StrCat("cannot restore ", path, ": ", restored.message()));
  }
  return std::nullopt;
}

}  // namespace summa::server
