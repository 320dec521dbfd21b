// PushEncoder: a worker's pushes in the wire format its job asked for at Join (--wire_dtype,
// --compress). Each step's gradient is encoded once per partition into buffers kept across
// steps, so that a resent push carries the same bytes (top-k's error feedback must not count a
// step twice); top-k's residuals (what earlier pushes left out) carry from step to step, and a
// rejoin decides what becomes of them from the step the server expects next.
#ifndef SUMMA_CLIENT_PUSH_ENCODER_H_
#define SUMMA_CLIENT_PUSH_ENCODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/compression.h"
#include "common/partition_map.h"

namespace summa::worker {

class PushEncoder {
 public:
  // Sets the format for these partitions. Unchanged partitions and format (a rejoin) keep
  // top-k's residuals and the last encoding, for Rejoined to judge; anything else starts afresh.
  void Configure(const std::vector<PartitionRange>& partitions, WireDType dtype, Compression compression);

  // After a Join whose server expects this rank's `next_step`, against the step the residuals
  // lead to (the last step encoded, plus one):
  //  - the same: the server has every step they account for; they stand;
  //  - one less: the server never applied the last encoding (it restored the version before, or
  //    the push was lost): it is taken back, residuals included, and the step is encoded again
  //    from the gradient recomputed (once: a second step back is not kept);
  //  - anything else: the server went back further (a checkpoint), or on without this rank;
  //    what earlier pushes left out no longer fits its history, and the residuals are dropped.
  // In async and ssp modes a push may have reached some partitions and not others; the step is
  // taken back for all, and the partitions that had it keep their first push (a duplicate is
  // dropped), so theirs is the residual of the recomputed gradient: exact in sync mode only.
  // Returns a line for the log when residuals were dropped, else "".
  std::string Rejoined(uint64_t next_step);

  // Encodes `gradients` (the flat buffer) for `step`, unless this step's push from the same
  // number of examples is already held (a resend). The same step from another number of
  // examples is another gradient: the held encoding is taken back first.
  void Encode(uint64_t step, int64_t num_examples, const float* gradients);

  // The format needs no encoding: pushes go out as slices of the caller's float32 buffer.
  bool dense_float32() const { return dtype_ == WireDType::kFloat32 && !compression_.sparse(); }
  // Each partition encodes on its own (a 16-bit dtype, no top-k, whose residuals and their undo
  // belong to a whole step): a staged step encodes each partition as soon as it is ready.
  bool per_partition() const { return !compression_.sparse(); }
  // Partition i of `gradients` (the flat buffer) in the job's dtype, for per_partition() formats
  // (nothing to do for dense_float32). The whole step held for a resend is forgotten.
  void EncodePartition(size_t i, const float* gradients);
  WireDType dtype() const { return dtype_; }
  const Compression& compression() const { return compression_; }
  // Partition i's encoded push (after Encode).
  absl::string_view bytes(size_t i) const { return absl::string_view(wire_[i].data(), wire_[i].size()); }
  // Top-k's residual of partition i (empty without top-k).
  absl::Span<const float> residual(size_t i) const;

 private:
  static constexpr uint64_t kNone = UINT64_MAX;
  std::vector<PartitionRange> partitions_;
  WireDType dtype_ = WireDType::kFloat32;
  Compression compression_;
  std::vector<std::vector<char>> wire_;  // per partition, sized once
  std::vector<TopKEncoder> topk_;
  uint64_t encoded_step_ = kNone;  // the step wire_ holds for a resend, or none
  int64_t encoded_examples_ = 0;
  // The step top-k's residuals lead to (the last encoded, plus one); kNone while they are zero.
  uint64_t residual_next_ = kNone;
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_PUSH_ENCODER_H_
