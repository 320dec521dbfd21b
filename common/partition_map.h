// PartitionMap: how a job's tensors are laid end to end in one flat float buffer, and how that
// buffer is cut into partitions of at most `partition_bytes` for the wire. The server builds it
// from the model's specs and sends the partitions in every Join reply; workers take them from
// there. Immutable after construction, so thread-safe.
#ifndef SUMMA_COMMON_PARTITION_MAP_H_
#define SUMMA_COMMON_PARTITION_MAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace summa {

// Every summa.v1 client cuts an AllReduce tensor into chunks of this many bytes (and a shorter
// tail), each a collective of its own; the server's limits size a message for one.
inline constexpr int64_t kAllReduceChunkBytes = 4 << 20;

struct PartitionRange {
  uint32_t id = 0;
  int64_t offset = 0;  // in elements of the flat buffer
  int64_t length = 0;  // in elements
};

class PartitionMap {
 public:
  // Fails on an empty model, a duplicate or empty name, a bad shape, or a partition size that
  // does not hold at least one float.
  static absl::StatusOr<PartitionMap> Create(std::vector<TensorSpec> specs,
                                             int64_t partition_bytes);

  const std::vector<TensorSpec>& specs() const { return specs_; }
  const std::vector<PartitionRange>& partitions() const { return partitions_; }
  // Where tensor i starts in the flat buffer, in elements.
  int64_t tensor_offset(size_t i) const { return tensor_offsets_[i]; }
  int64_t num_elements() const { return num_elements_; }
  int64_t partition_bytes() const { return partition_bytes_; }

 private:
  std::vector<TensorSpec> specs_;
  std::vector<int64_t> tensor_offsets_;
  std::vector<PartitionRange> partitions_;
  int64_t num_elements_ = 0;
  int64_t partition_bytes_ = 0;
};

// Which of `shards` server shards holds each partition (by position in `partitions`), balanced
// by bytes: the largest partition first, each to the shard holding the fewest floats so far (the
// lower shard on a tie). Deterministic: every shard computes the same assignment from the same
// map.
std::vector<int> AssignShards(const std::vector<PartitionRange>& partitions, int shards);

}  // namespace summa

#endif  // SUMMA_COMMON_PARTITION_MAP_H_
