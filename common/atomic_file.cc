#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

AtomicFile::AtomicFile(std::string path, int fd) : path_(std::move(path)), tmp_(path_ + ".tmp"), fd_(fd) {}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + tmp);
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, fd));
}

absl::Status AtomicFile::Append(const void* data, size_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is already committed"));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + tmp_);
    }
    p += n;
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::WriteAt(absl::string_view data, off_t offset) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is already committed"));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + tmp_);
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is already committed"));
  if (::fsync(fd_) != 0) return Errno("fsync " + tmp_);  // the destructor removes the temporary file
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const absl::Status closed = Errno("close " + tmp_);
    ::unlink(tmp_.c_str());
    return closed;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const absl::Status renamed = Errno("rename " + tmp_);
    ::unlink(tmp_.c_str());
    return renamed;
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("open " + dir);
  const bool synced = ::fsync(dfd) == 0;  // make the rename itself durable
  ::close(dfd);
  if (!synced) return Errno("fsync " + dir);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path));
  SUMMA_RETURN_IF_ERROR(file->Append(contents));
  return file->Commit();
}

}  // namespace summa
