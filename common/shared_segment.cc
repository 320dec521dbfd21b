#include "common/shared_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace summa {
namespace {

absl::Status Errno(absl::string_view what) {
  const int error = errno;
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == ENOMEM || error == EMFILE || error == ENFILE || error == ENOSPC) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::UnavailableError(message);
}

}  // namespace

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SharedSegment::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
}

uint64_t SharedSegment::PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<SharedSegment> SharedSegment::Create(absl::string_view name, uint64_t bytes, bool writable_by_others) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared segment of 0 bytes");
  const uint64_t page = PageBytes();
  const uint64_t size = (bytes + page - 1) / page * page;
  SharedSegment s;
  s.fd_ = ::memfd_create(std::string(name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd_ < 0) return Errno("memfd_create");
  if (::ftruncate(s.fd_, static_cast<off_t>(size)) != 0) return Errno("sizing a shared segment");
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_, 0);
  if (mapped == MAP_FAILED) return Errno("mapping a shared segment");
  s.data_ = static_cast<char*>(mapped);
  s.size_ = size;
  // Our own mapping was made before the write seal, so it stays writable; nobody else's can be.
  int seals = F_SEAL_SHRINK | F_SEAL_GROW;
  if (!writable_by_others) seals |= F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
  if (::fcntl(s.fd_, F_ADD_SEALS, seals) != 0) return Errno("sealing a shared segment");
  return s;
}

absl::StatusOr<SharedSegment> SharedSegment::Adopt(int fd, uint64_t bytes, uint64_t max_bytes, Access access,
                                                   absl::string_view what) {
  SharedSegment s;
  s.fd_ = fd;  // closed by `s` on every path below
  struct stat st = {};
  if (::fstat(fd, &st) != 0) return Errno(absl::StrCat(what, ": fstat"));
  struct statfs fs = {};
  if (!S_ISREG(st.st_mode) || ::fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a memory file of ordinary pages (memfd_create without MFD_HUGETLB)"));
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", st.st_size, " bytes, not the ", bytes, " its sender declared"));
  }
  if (bytes == 0 || bytes % PageBytes() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", bytes, " bytes: a segment is a positive number of whole ", PageBytes(), "-byte pages"));
  }
  if (bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", bytes, " bytes is larger than the ", max_bytes, " bytes it may hold"));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not sealed against shrinking (F_SEAL_SHRINK): its reader could fault on it"));
  }
  const int prot = access == Access::kReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
  void* mapped = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    const int error = errno;
    const std::string message = absl::StrCat(what, " cannot be mapped ",
                                             access == Access::kReadWrite ? "read-write" : "read-only", ": ",
                                             std::strerror(error));
    return error == ENOMEM ? absl::ResourceExhaustedError(message) : absl::InvalidArgumentError(message);
  }
  s.data_ = static_cast<char*>(mapped);
  s.size_ = bytes;
  s.CloseDescriptor();
  return s;
}

void SharedSegment::CloseDescriptor() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status SharedSegment::KeepReadOnlyDescriptor() {
  absl::StatusOr<int> read_only = ReadOnlyDescriptor();
  if (!read_only.ok()) return read_only.status();
  CloseDescriptor();
  fd_ = *read_only;
  return absl::OkStatus();
}

absl::StatusOr<int> SharedSegment::ReadOnlyDescriptor() const {
  if (fd_ < 0) return absl::FailedPreconditionError("no segment");
  const std::string path = absl::StrCat("/proc/self/fd/", fd_);
  int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) ro = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (ro < 0) return Errno("a read-only descriptor of a shared segment");
  return ro;
}

}  // namespace summa
