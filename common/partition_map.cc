#include "common/partition_map.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa {

absl::StatusOr<PartitionMap> PartitionMap::Create(std::vector<TensorSpec> specs,
                                                  int64_t partition_bytes) {
  if (specs.empty()) return absl::InvalidArgumentError("the model has no tensors");
  if (partition_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition size ", partition_bytes, " bytes cannot hold one float32"));
  }
  PartitionMap map;
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& spec : specs) {
    if (spec.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", spec.name, "' appears twice"));
    }
    absl::Status shape_ok = ValidateShape(spec.shape);
    if (!shape_ok.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': ", shape_ok.message()));
    }
    map.tensor_offsets_.push_back(map.num_elements_);
    map.num_elements_ += spec.num_elements();
  }
  const int64_t per_partition = partition_bytes / 4;
  for (int64_t offset = 0; offset < map.num_elements_; offset += per_partition) {
    map.partitions_.push_back({static_cast<uint32_t>(map.partitions_.size()), offset,
                               std::min(per_partition, map.num_elements_ - offset)});
  }
  map.specs_ = std::move(specs);
  map.partition_bytes_ = partition_bytes;
  return map;
}

std::vector<int> AssignShards(const std::vector<PartitionRange>& partitions, int shards) {
  std::vector<size_t> order(partitions.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return partitions[a].length > partitions[b].length; });
  std::vector<int64_t> load(std::max(1, shards), 0);
  std::vector<int> shard_of(partitions.size(), 0);
  for (size_t i : order) {
    const int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    shard_of[i] = least;
    load[least] += partitions[i].length;
  }
  return shard_of;
}

}  // namespace summa
