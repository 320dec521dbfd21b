#include "server/core/snapshot.h"

#include <algorithm>

namespace summa::server {

void Snapshot::Ref(Buffer* b) {
  if (b != nullptr) b->refs.fetch_add(1, std::memory_order_relaxed);
}

void Snapshot::Unref(Buffer* b) {
  // Release: a reader's last access happens before the pool sees the buffer free (acquire).
  if (b != nullptr && b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
}

absl::Span<const float> Snapshot::values() const {
  if (buffer_ == nullptr) return {};
  return buffer_->data;
}

absl::Span<const uint16_t> Snapshot::Encoded(WireDType dtype) const {
  if (dtype == WireDType::kFloat32) return {};  // float32 is values(): no encoding to make
  const int which = dtype == WireDType::kBfloat16 ? 0 : 1;
  absl::MutexLock lock(&buffer_->encode_mu);
  std::vector<uint16_t>& out = buffer_->halves[which];
  if (!buffer_->halves_ready[which]) {
    out.resize(buffer_->data.size());
    EncodeValues(dtype, buffer_->data, out.data());
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
    n += b->data.capacity() * sizeof(float);
    absl::MutexLock lock(&b->encode_mu);
    n += (b->halves[0].capacity() + b->halves[1].capacity()) * sizeof(uint16_t);
  }
  return n;
}

int64_t SnapshotPool::GrowthFor(int64_t length) const {
  auto free = std::find_if(buffers_.begin(), buffers_.end(), IsFree);
  const int64_t have = free == buffers_.end() ? 0 : static_cast<int64_t>((*free)->data.capacity());
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
  b->data.resize(length);
  {
    absl::MutexLock lock(&b->encode_mu);  // no reader holds it: only the pool's reference is left
    b->halves_ready[0] = b->halves_ready[1] = false;
  }
  *data = b->data.data();
  Snapshot::Ref(b);
  return Snapshot(b);
}

}  // namespace summa::server
