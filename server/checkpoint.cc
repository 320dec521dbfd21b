#include "server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/partition_map.h"
#include "common/tensor_proto.h"

namespace summa::server {
namespace {

constexpr char kMagic[] = "SUMMACK1";
constexpr size_t kMagicSize = 8;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + path);
    }
    done += n;
  }
  return absl::OkStatus();
}

void AppendLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
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
                      absl::StrJoin(j.slot_names, ", "), "]");
}

}  // namespace

uint64_t ServerSnapshot::version() const {
  uint64_t low = partitions.empty() ? 0 : UINT64_MAX;
  for (const PartitionSnapshot& p : partitions) low = std::min(low, p.version);
  return low;
}

summa::v1::Checkpoint EncodeCheckpoint(const ServerSnapshot& s) {
  summa::v1::Checkpoint c;
  c.set_version(s.version());
  c.set_world_size(s.job.world_size);
  c.set_mode(ModeToProto(s.job.mode));
  c.set_partition_bytes(s.job.partition_bytes);
  c.set_optimizer(s.job.optimizer);
  c.set_optimizer_name(s.job.optimizer_name);
  for (const std::string& name : s.job.slot_names) c.add_slot_names(name);
  c.set_created_unix_seconds(absl::ToUnixSeconds(s.created));
  for (const TensorSpec& spec : s.specs) SpecToProto(spec, c.add_params());
  for (const PartitionSnapshot& p : s.partitions) {
    summa::v1::PartitionCheckpoint* out = c.add_partitions();
    out->set_id(p.id);
    out->set_version(p.version);
    out->set_updates(p.updates);
    out->set_weights(Floats(p.weights));
    for (const std::vector<float>& slot : p.slots) out->add_slots(Floats(slot));
    for (uint64_t next : p.next_steps) out->add_next_steps(next);
  }
  return c;
}

absl::StatusOr<ServerSnapshot> DecodeCheckpoint(const summa::v1::Checkpoint& c, const JobDescription& ours) {
  ServerSnapshot s;
  JobDescription& theirs = s.job;
  theirs.world_size = c.world_size();
  absl::StatusOr<Mode> mode = ModeFromProto(c.mode());
  if (!mode.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", mode.status().message()));
  theirs.mode = *mode;
  theirs.partition_bytes = c.partition_bytes();
  theirs.optimizer_name = c.optimizer_name();
  theirs.optimizer = c.optimizer();
  theirs.slot_names.assign(c.slot_names().begin(), c.slot_names().end());
  if (theirs.world_size != ours.world_size || theirs.mode != ours.mode ||
      theirs.partition_bytes != ours.partition_bytes || theirs.optimizer_name != ours.optimizer_name ||
      theirs.slot_names != ours.slot_names) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint is of a job of ", Describe(theirs),
                                                      "; this server runs ", Describe(ours)));
  }
  if (theirs.optimizer != ours.optimizer) {
    SUMMA_LOG(WARNING) << "the checkpoint's optimizer was " << theirs.optimizer << "; going on with "
                       << ours.optimizer << " and its state";
  }
  s.created = absl::FromUnixSeconds(c.created_unix_seconds());
  for (const summa::v1::Tensor& t : c.params()) {
    absl::StatusOr<TensorSpec> spec = SpecFromProto(t);
    if (!spec.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's ", spec.status().message()));
    s.specs.push_back(*std::move(spec));
  }
  // Counted before the map is built: a model of 2^40 floats in 16-byte partitions would be 2^38
  // partition ranges, while the file may hold two.
  int64_t elements = 0;
  for (const TensorSpec& spec : s.specs) {
    elements += spec.num_elements();  // each at most 2^40 (SpecFromProto): no overflow below 2^62
    if (elements > (int64_t{1} << 62)) return absl::DataLossError("the checkpoint's model is too large");
  }
  const int64_t per_partition = std::max<int64_t>(ours.partition_bytes / 4, 1);
  if ((elements + per_partition - 1) / per_partition != c.partitions_size()) {
    return absl::DataLossError(absl::StrCat("the checkpoint holds ", c.partitions_size(), " partitions; its model has ",
                                            (elements + per_partition - 1) / per_partition));
  }
  absl::StatusOr<PartitionMap> map = PartitionMap::Create(s.specs, ours.partition_bytes);
  if (!map.ok()) return absl::DataLossError(absl::StrCat("the checkpoint's model: ", map.status().message()));
  if (map->partitions().size() != static_cast<size_t>(c.partitions_size())) {
    return absl::DataLossError(absl::StrCat("the checkpoint holds ", c.partitions_size(),
                                            " partitions; its model has ", map->partitions().size()));
  }
  for (const PartitionRange& range : map->partitions()) {
    const summa::v1::PartitionCheckpoint& in = c.partitions(range.id);
    const std::string what = absl::StrCat("partition ", range.id);
    if (in.id() != range.id || in.slots_size() != static_cast<int>(ours.slot_names.size()) ||
        in.next_steps_size() != ours.world_size) {
      return absl::DataLossError(absl::StrCat(what, " of the checkpoint is malformed"));
    }
    PartitionSnapshot p;
    p.id = range.id;
    p.version = in.version();
    p.updates = in.updates();
    if (p.updates > p.version) return absl::DataLossError(absl::StrCat(what, " has more updates than steps"));
    if (theirs.mode == Mode::kSync) {
      // A sync checkpoint is taken with every partition at one version, and no rank past it.
      if (in.version() != c.version()) {
        return absl::DataLossError(absl::StrCat(what, " is at version ", in.version(),
                                                "; a sync checkpoint's partitions are all at ", c.version()));
      }
      for (uint64_t next : in.next_steps()) {
        if (next > in.version()) {
          return absl::DataLossError(absl::StrCat(what, " has a push of step ", next - 1,
                                                  " recorded at version ", in.version()));
        }
      }
    }
    absl::StatusOr<std::vector<float>> weights = FloatsOf(in.weights(), range.length, what + "'s weights");
    if (!weights.ok()) return weights.status();
    p.weights = *std::move(weights);
    for (int i = 0; i < in.slots_size(); ++i) {
      absl::StatusOr<std::vector<float>> slot =
          FloatsOf(in.slots(i), range.length, absl::StrCat(what, "'s ", ours.slot_names[i]));
      if (!slot.ok()) return slot.status();
      p.slots.push_back(*std::move(slot));
    }
    p.next_steps.assign(in.next_steps().begin(), in.next_steps().end());
    s.partitions.push_back(std::move(p));
  }
  return s;
}

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const summa::v1::Checkpoint& checkpoint, int keep) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  absl::StatusOr<std::string> framed = FrameCheckpoint(checkpoint);
  if (!framed.ok()) return framed.status();
  const std::string& file = *framed;

  const std::string path = absl::StrFormat("%s/ckpt-%012d.summa", dir, checkpoint.version());
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + tmp);
  absl::Status written = WriteAll(fd, file, tmp);
  if (written.ok() && ::fsync(fd) != 0) written = Errno("fsync " + tmp);
  ::close(fd);
  if (!written.ok()) {
    ::unlink(tmp.c_str());
    return written;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename " + tmp);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
  // Keep the newest `keep` checkpoints.
  std::vector<std::string> all;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && entry.path().extension() == ".summa") all.push_back(entry.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + keep < all.size(); ++i) std::filesystem::remove(all[i], ec);
  return path;
}

absl::StatusOr<std::string> FrameCheckpoint(const summa::v1::Checkpoint& checkpoint) {
  std::string body;
  if (!checkpoint.SerializeToString(&body)) return absl::InternalError("cannot serialize checkpoint");
  std::string file(kMagic, kMagicSize);
  AppendLe(file, body.size(), 8);
  file += body;
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(file.data()), file.size());
  AppendLe(file, crc, 4);
  return file;
}

absl::StatusOr<summa::v1::Checkpoint> ParseCheckpointBytes(absl::string_view file, absl::string_view name) {
  if (file.size() < kMagicSize + 12 || file.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return absl::DataLossError(absl::StrCat(name, ": not a Summa checkpoint (bad magic or too short)"));
  }
  const uint64_t length = ReadLe(file.data() + kMagicSize, 8);
  if (file.size() != kMagicSize + 8 + length + 4) {
    return absl::DataLossError(absl::StrCat(name, ": torn: header promises ", length,
                                            " bytes, file holds ", file.size() - kMagicSize - 12));
  }
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(file.data()), file.size() - 4);
  if (crc != ReadLe(file.data() + file.size() - 4, 4)) {
    return absl::DataLossError(absl::StrCat(name, ": checksum mismatch"));
  }
  summa::v1::Checkpoint checkpoint;
  if (!checkpoint.ParseFromArray(file.data() + kMagicSize + 8, static_cast<int>(length))) {
    return absl::DataLossError(absl::StrCat(name, ": cannot parse"));
  }
  return checkpoint;
}

absl::StatusOr<summa::v1::Checkpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseCheckpointBytes(buffer.str(), path);
}

std::optional<RestoredCheckpoint> LoadNewestCheckpoint(const std::string& dir,
                                                       std::vector<std::string>* warnings) {
  std::error_code ec;
  std::vector<std::string> candidates;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && entry.path().extension() == ".summa") {
      candidates.push_back(entry.path());
    }
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const std::string& path : candidates) {
    absl::StatusOr<summa::v1::Checkpoint> c = ReadCheckpoint(path);
    if (c.ok()) return RestoredCheckpoint{*std::move(c), path};
    warnings->push_back(absl::StrCat("ignoring checkpoint: ", c.status().message()));
  }
  return std::nullopt;
}

}  // namespace summa::server
