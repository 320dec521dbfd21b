#include "client/push_encoder.h"

#include "absl/strings/str_cat.h"

namespace summa::worker {

namespace {

bool SamePartitions(const std::vector<PartitionRange>& a, const std::vector<PartitionRange>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].offset != b[i].offset || a[i].length != b[i].length) return false;
  }
  return true;
}

}  // namespace

void PushEncoder::Configure(const std::vector<PartitionRange>& partitions, WireDType dtype,
                            Compression compression) {
  if (dtype == dtype_ && compression.topk_ratio == compression_.topk_ratio &&
      SamePartitions(partitions, partitions_) && wire_.size() == partitions.size()) {
    return;
  }
  partitions_ = partitions;
  dtype_ = dtype;
  compression_ = compression;
  encoded_step_ = kNone;
  residual_next_ = kNone;
  wire_.clear();
  topk_.clear();
  if (dense_float32()) {
    wire_.resize(partitions_.size());  // unused: pushes are slices of the caller's buffer
    return;
  }
  for (const PartitionRange& p : partitions_) {
    if (compression_.sparse()) {
      topk_.emplace_back(p.length, TopKCount(p.length, compression_.topk_ratio), dtype_);
      wire_.emplace_back(topk_.back().bytes());
    } else {
      wire_.emplace_back(p.length * WireDTypeBytes(dtype_));
    }
  }
}

std::string PushEncoder::Rejoined(uint64_t next_step) {
  encoded_step_ = kNone;  // a push after a Join is encoded from the gradient computed then
  const uint64_t expected = residual_next_;
  if (topk_.empty() || expected == kNone || next_step == expected) return "";
  if (next_step + 1 == expected && topk_[0].can_undo()) {  // every partition's encoder alike
    for (TopKEncoder& e : topk_) e.Undo();
    residual_next_ = next_step;
    return "";
  }
  for (TopKEncoder& e : topk_) e.Reset();
  residual_next_ = kNone;
  return absl::StrCat("the server expects step ", next_step, " where this worker's residuals lead to step ", expected,
                      ": top-k's residuals (what earlier pushes left out) are dropped");
}

void PushEncoder::Encode(uint64_t step, int64_t num_examples, const float* gradients) {
  if (dense_float32()) return;
  if (step == encoded_step_) {
    if (num_examples == encoded_examples_) return;  // a resend: the same bytes
    for (TopKEncoder& e : topk_) e.Undo();
  }
  for (size_t i = 0; i < partitions_.size(); ++i) {
    const PartitionRange& p = partitions_[i];
    const absl::Span<const float> g(gradients + p.offset, p.length);
    if (compression_.sparse()) {
      topk_[i].Encode(g, wire_[i].data());
    } else {
      EncodeValues(dtype_, g, wire_[i].data());
    }
  }
  encoded_step_ = step;
  encoded_examples_ = num_examples;
  residual_next_ = step + 1;
}

void PushEncoder::EncodePartition(size_t i, const float* gradients) {
  if (dense_float32()) return;
  const PartitionRange& p = partitions_[i];
  EncodeValues(dtype_, absl::Span<const float>(gradients + p.offset, p.length), wire_[i].data());
  encoded_step_ = kNone;  // wire_ is no longer one Encode's step
}

absl::Span<const float> PushEncoder::residual(size_t i) const {
  if (topk_.empty()) return {};
  return topk_[i].residual();
}

}  // namespace summa::worker
