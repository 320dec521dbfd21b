// Snapshot: a counted reference to an immutable float32 buffer that any number of replies send
// at once, without a copy each: a partition's weights as of one version, or a collective's sum of
// one round. The gRPC edge holds a reference (Lend) while it writes the bytes to the sockets, so
// a buffer is reused only once every reader has let go of it. No gRPC here: the core stays free
// of it.
//
// SnapshotPool keeps the buffers of one partition or collective and hands out one that no reader
// holds, allocating (and first touching) a new one only when every buffer is still being sent: in
// steady state a step allocates nothing (two buffers: the one being sent and the one being filled).
//
// In a process that serves the shared-memory plane (ShareLargeBuffers), buffers of kSharedBytes
// or more live in shared segments (memfds, common/shared_segment.h): the plane's replies name the
// segment and the bytes in it instead of copying them (FindShared), and a worker on this host
// maps it read-only and reads the values out. A buffer whose segment cannot be made (no
// descriptors left) lives on the heap instead, as every buffer does in other processes.
//
// Thread-safety: Snapshot handles may be copied and dropped on any thread; a pool is not
// thread-safe (its owner's lock guards it), and a buffer is written only between Acquire and the
// first copy of its handle.
#ifndef SUMMA_SERVER_CORE_SNAPSHOT_H_
#define SUMMA_SERVER_CORE_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/shared_segment.h"

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/compression.h"

namespace summa::server {

class Snapshot {
 public:
  Snapshot() = default;
  Snapshot(const Snapshot& other) : buffer_(other.buffer_) { Ref(buffer_); }
  Snapshot(Snapshot&& other) noexcept : buffer_(other.buffer_) { other.buffer_ = nullptr; }
  Snapshot& operator=(Snapshot other) noexcept {
    std::swap(buffer_, other.buffer_);
    return *this;
  }
  ~Snapshot() { Unref(buffer_); }

  bool empty() const { return buffer_ == nullptr; }
  absl::Span<const float> values() const;

  // The values in a 16-bit wire dtype (bf16 or fp16): encoded by the first caller and kept with
  // the buffer until the pool reuses it, so that every reply of one version shares one encoding.
  // Valid as long as this handle (or a Lend) holds the buffer. Thread-safe. Empty for float32
  // (use values()).
  absl::Span<const uint16_t> Encoded(WireDType dtype) const;

  // A reference for code that cannot hold a Snapshot (a gRPC slice's destroy callback): the
  // values stay valid until Return(token) is called, exactly once.
  void* Lend() const;
  static void Return(void* token);

  // The shared segment that the `bytes` bytes at `p` lie in, if they lie in one buffer's: its
  // descriptor (the buffer's own: duplicate it to keep it), a number no other segment of this
  // process has had, where the bytes start in it, and its size. The caller holds a reference to
  // the buffer (a Snapshot, or a Lend) while it uses the answer. Thread-safe.
  struct SharedView {
    int fd = -1;
    uint64_t id = 0;
    uint64_t offset = 0;
    uint64_t segment_bytes = 0;
  };
  static bool FindShared(const void* p, size_t bytes, SharedView* out);
  // From now on, buffers of kSharedBytes or more that pools make (or grow) are shared segments.
  // For the shared-memory plane, as it starts (server/rpc/socket_plane.h). Thread-safe.
  static void ShareLargeBuffers();
  // Buffers this size or larger are shared segments.
  static constexpr int64_t kSharedBytes = 64 << 10;

 private:
  friend class SnapshotPool;
  struct Buffer {
    Buffer() = default;
    ~Buffer();
    std::atomic<int> refs{1};
    float* data = nullptr;  // `length` floats, in `heap` or `shared`
    int64_t length = 0;
    std::vector<float> heap;
    SharedSegment shared;
    uint64_t id = 0;  // shared's number (FindShared)
    // Room for `length` floats: the storage kept where it is large enough, else new storage.
    void Resize(int64_t length);
    int64_t capacity() const;
    absl::Mutex encode_mu;
    std::vector<uint16_t> halves[2] ABSL_GUARDED_BY(encode_mu);  // bf16, fp16
    bool halves_ready[2] ABSL_GUARDED_BY(encode_mu) = {false, false};
  };
  explicit Snapshot(Buffer* adopted) : buffer_(adopted) {}  // takes over one reference
  static void Ref(Buffer* b);
  static void Unref(Buffer* b);

  Buffer* buffer_ = nullptr;
};

class SnapshotPool {
 public:
  SnapshotPool() = default;
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;
  ~SnapshotPool();

  // A buffer of `length` floats that no snapshot references, for the caller to fill through
  // `data` before it hands the snapshot out. Reuses a free buffer (keeping its capacity);
  // allocates only when none is free.
  Snapshot Acquire(int64_t length, float** data);

  // Buffers allocated so far (each is touched once, when first acquired at its size).
  size_t size() const { return buffers_.size(); }
  // The bytes the pool's buffers hold, and how many more an Acquire of `length` floats would
  // allocate.
  int64_t bytes() const;
  int64_t GrowthFor(int64_t length) const;

 private:
  // A buffer only the pool references.
  static bool IsFree(const Snapshot::Buffer* b);
  std::vector<Snapshot::Buffer*> buffers_;  // each holds one reference of the pool's
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_SNAPSHOT_H_
