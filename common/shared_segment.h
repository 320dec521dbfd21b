// SharedSegment: a piece of memory two processes on one host share, backed by a memfd (an
// anonymous file with no name in any filesystem: another user's process cannot open it, since
// /proc/PID/fd/N asks for the right to trace its owner). The shared-memory data plane
// (common/rpc/socket_frame.h) hands segments over a Unix socket (SCM_RIGHTS):
//   - a request segment, made by the client and written by it alone; the server maps it and reads
//     the requests placed there. Sealed against shrinking (F_SEAL_SHRINK) before it is sent: a
//     mapping of a file cut short would fault (SIGBUS) in the reader, and the server refuses an
//     unsealed one.
//   - a reply segment, made by the server, mapped writable by the server before it seals it
//     against any later write (F_SEAL_FUTURE_WRITE): the descriptor a client gets (read-only too)
//     can map it for reading and nothing else, whoever opens it again.
// Owns its mapping and descriptor. Not thread-safe; the memory's use is the caller's protocol.
#ifndef SUMMA_COMMON_SHARED_SEGMENT_H_
#define SUMMA_COMMON_SHARED_SEGMENT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace summa {

class SharedSegment {
 public:
  enum class Access { kReadOnly, kReadWrite };

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept { *this = static_cast<SharedSegment&&>(other); }
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment() { Reset(); }

  // A new segment of `bytes` (rounded up to whole pages), mapped read-write, sealed against
  // growing and shrinking. `name` shows in /proc/PID/fd (memfd:NAME). `writable_by_others`
  // false: sealed against every later writable mapping or write, this process's own mapping
  // excepted (a reply segment). RESOURCE_EXHAUSTED where memory or descriptors run out.
  static absl::StatusOr<SharedSegment> Create(absl::string_view name, uint64_t bytes, bool writable_by_others);

  // Maps a segment another process sent: `fd` is taken over (closed on every path: the mapping
  // keeps the memory, so a process holds no descriptor per segment it reads). It must be a memfd
  // of ordinary pages (tmpfs: hugetlb pages could be taken back from under the mapping), of the
  // size `bytes` its sender declared, at most `max_bytes`, and sealed against shrinking;
  // INVALID_ARGUMENT naming what is wrong otherwise (`what` names the segment).
  static absl::StatusOr<SharedSegment> Adopt(int fd, uint64_t bytes, uint64_t max_bytes, Access access,
                                             absl::string_view what);

  // A new descriptor of this segment that can only read it (the kernel's own open of
  // /proc/self/fd/N, read-only), for sending; the caller closes it. Falls back to a duplicate of
  // the descriptor where /proc is not mounted (the seals still refuse writes).
  absl::StatusOr<int> ReadOnlyDescriptor() const;
  // Keeps only a read-only descriptor (ReadOnlyDescriptor's) in place of the one it made, for a
  // segment whose descriptor is sent again and again (a published snapshot's).
  absl::Status KeepReadOnlyDescriptor();
  // Closes the descriptor; the mapping stays (a segment sent once, at attach).
  void CloseDescriptor();

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  bool valid() const { return data_ != nullptr; }
  void Reset();

  // Bytes in a page: segments are whole pages.
  static uint64_t PageBytes();

 private:
  int fd_ = -1;
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace summa

#endif  // SUMMA_COMMON_SHARED_SEGMENT_H_
