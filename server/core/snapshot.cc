#include "server/core/snapshot.h"

#include <algorithm>
#include <atomic>
#include <map>

#include "absl/synchronization/mutex.h"

namespace summa::server {
namespace {

// The shared buffers of the process by address, for FindShared: a buffer's segment is added
// when it is made and removed before it is unmapped.
struct SharedEntry {
  uintptr_t end;
  int fd;
  uint64_t id;
  uint64_t size;
};
absl::Mutex shared_mu(absl::kConstInit);
std::map<uintptr_t, SharedEntry>& SharedByAddress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_mu) {
  static auto* by_address = new std::map<uintptr_t, SharedEntry>();
  return *by_address;
}
std::atomic<uint64_t> next_shared_id{1};
std::atomic<bool> share_large_buffers{false};

void Unregister(const SharedSegment& s) {
  if (!s.valid()) return;
  absl::MutexLock lock(&shared_mu);
  SharedByAddress().erase(reinterpret_cast<uintptr_t>(s.data()));
}

}  // namespace

Snapshot::Buffer::~Buffer() { Unregister(shared); }

int64_t Snapshot::Buffer::capacity() const {
  return shared.valid() ? static_cast<int64_t>(shared.size() / sizeof(float)) : static_cast<int64_t>(heap.capacity());
}

void Snapshot::Buffer::Resize(int64_t n) {
  length = n;
  if (shared.valid() && capacity() >= n) {
    data = reinterpret_cast<float*>(shared.data());
    return;
  }
  if (n * static_cast<int64_t>(sizeof(float)) >= kSharedBytes && share_large_buffers.load(std::memory_order_relaxed)) {
    absl::StatusOr<SharedSegment> made = SharedSegment::Create("summa-weights", n * sizeof(float),
                                                               /*writable_by_others=*/false);
    // Sent to every worker that reads it: a descriptor that can only read (the seals refuse
    // writes whatever the descriptor).
    if (made.ok()) (void)made->KeepReadOnlyDescriptor();
    if (made.ok()) {
      Unregister(shared);
      shared = *std::move(made);
      heap = std::vector<float>();
      id = next_shared_id.fetch_add(1, std::memory_order_relaxed);
      {
        absl::MutexLock lock(&shared_mu);
        const uintptr_t begin = reinterpret_cast<uintptr_t>(shared.data());
        SharedByAddress()[begin] = SharedEntry{begin + shared.size(), shared.fd(), id, shared.size()};
      }
      data = reinterpret_cast<float*>(shared.data());
      return;
    }
    // No segment to be had (descriptors or memory run out): the heap, copied into replies.
  }
  Unregister(shared);
  shared.Reset();
  heap.resize(n);
  data = heap.data();
}

void Snapshot::ShareLargeBuffers() { share_large_buffers.store(true, std::memory_order_relaxed); }

bool Snapshot::FindShared(const void* p, size_t bytes, SharedView* out) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  absl::MutexLock lock(&shared_mu);
  const std::map<uintptr_t, SharedEntry>& by_address = SharedByAddress();
  auto it = by_address.upper_bound(at);
  if (it == by_address.begin()) return false;
  --it;
  if (at + bytes > it->second.end) return false;
  *out = SharedView{it->second.fd, it->second.id, at - it->first, it->second.size};
  return true;
}

void Snapshot::Ref(Buffer* b) {
  if (b != nullptr) b->refs.fetch_add(1, std::memory_order_relaxed);
}

void Snapshot::Unref(Buffer* b) {
  // Release: a reader's last access happens before the pool sees the buffer free (acquire).
  if (b != nullptr && b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
}

absl::Span<const float> Snapshot::values() const {
  if (buffer_ == nullptr) return {};
  return absl::Span<const float>(buffer_->data, buffer_->length);
}

absl::Span<const uint16_t> Snapshot::Encoded(WireDType dtype) const {
  if (dtype == WireDType::kFloat32) return {};  // float32 is values(): no encoding to make
  const int which = dtype == WireDType::kBfloat16 ? 0 : 1;
  absl::MutexLock lock(&buffer_->encode_mu);
  std::vector<uint16_t>& out = buffer_->halves[which];
  if (!buffer_->halves_ready[which]) {
    out.resize(buffer_->length);
    EncodeValues(dtype, absl::Span<const float>(buffer_->data, buffer_->length), out.data());
    buffer_->halves_ready[which] = true;
  }
  return out;
}

void* Snapshot::Lend() const {
  Ref(buffer_);
  return buffer_;
}

void Snapshot::Return(void* token) { Unref(static_cast<Buffer*>(token)); }

SnapshotPool::~SnapshotPool() {
  for (Snapshot::Buffer* b : buffers_) Snapshot::Unref(b);
}

bool SnapshotPool::IsFree(const Snapshot::Buffer* b) { return b->refs.load(std::memory_order_acquire) == 1; }

int64_t SnapshotPool::bytes() const {
  int64_t n = 0;
  for (Snapshot::Buffer* b : buffers_) {
    n += b->capacity() * sizeof(float);
    absl::MutexLock lock(&b->encode_mu);
    n += (b->halves[0].capacity() + b->halves[1].capacity()) * sizeof(uint16_t);
  }
  return n;
}

int64_t SnapshotPool::GrowthFor(int64_t length) const {
  auto free = std::find_if(buffers_.begin(), buffers_.end(), IsFree);
  const int64_t have = free == buffers_.end() ? 0 : (*free)->capacity();
  return std::max<int64_t>(0, length - have) * static_cast<int64_t>(sizeof(float));
}

Snapshot SnapshotPool::Acquire(int64_t length, float** data) {
  auto free = std::find_if(buffers_.begin(), buffers_.end(), IsFree);
  Snapshot::Buffer* b;
  if (free != buffers_.end()) {
    b = *free;
  } else {
    b = new Snapshot::Buffer;
    buffers_.push_back(b);
  }
  b->Resize(length);
  {
    absl::MutexLock lock(&b->encode_mu);  // no reader holds it: only the pool's reference is left
    b->halves_ready[0] = b->halves_ready[1] = false;
  }
  *data = b->data;
  Snapshot::Ref(b);
  return Snapshot(b);
}

}  // namespace summa::server
