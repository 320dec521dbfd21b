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
// Thread-safety: Snapshot handles may be copied and dropped on any thread; a pool is not
// thread-safe (its owner's lock guards it), and a buffer is written only between Acquire and the
// first copy of its handle.
#ifndef SUMMA_SERVER_CORE_SNAPSHOT_H_
#define SUMMA_SERVER_CORE_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

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

 private:
  friend class SnapshotPool;
  struct Buffer {
    std::atomic<int> refs{1};
    std::vector<float> data;
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
