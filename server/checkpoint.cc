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

}  // namespace

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const summa::v1::Checkpoint& checkpoint, int keep) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::string body;
  if (!checkpoint.SerializeToString(&body)) return absl::InternalError("cannot serialize checkpoint");
  std::string file(kMagic, kMagicSize);
  AppendLe(file, body.size(), 8);
  file += body;
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(file.data()), file.size());
  AppendLe(file, crc, 4);

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

absl::StatusOr<summa::v1::Checkpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string file = buffer.str();
  if (file.size() < kMagicSize + 12 || file.compare(0, kMagicSize, kMagic) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a Summa checkpoint (bad magic or too short)"));
  }
  const uint64_t length = ReadLe(file.data() + kMagicSize, 8);
  if (file.size() != kMagicSize + 8 + length + 4) {
    return absl::DataLossError(absl::StrCat(path, ": torn: header promises ", length,
                                            " bytes, file holds ", file.size() - kMagicSize - 12));
  }
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(file.data()), file.size() - 4);
  if (crc != ReadLe(file.data() + file.size() - 4, 4)) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch"));
  }
  summa::v1::Checkpoint checkpoint;
  if (!checkpoint.ParseFromArray(file.data() + kMagicSize + 8, static_cast<int>(length))) {
    return absl::DataLossError(absl::StrCat(path, ": cannot parse"));
  }
  return checkpoint;
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
