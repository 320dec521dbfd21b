#include "client/row_batch.h"

#include <algorithm>
#include <cstring>

#include "common/row_hash.h"

namespace summa::worker {

void RowBatch::Plan(absl::Span<const uint64_t> ids, int shards) {
  const size_t n = ids.size();
  // At most half the slots in use, so that probes stay short.
  size_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  if (keys_.size() < slots) {
    keys_.resize(slots);
    values_.resize(slots);
    stamps_.assign(slots, 0);
    stamp_ = 0;
  }
  if (++stamp_ == 0) {  // the stamps wrapped: every slot is free again
    std::fill(stamps_.begin(), stamps_.end(), 0);
    stamp_ = 1;
  }
  const size_t mask = keys_.size() - 1;
  seen_.clear();
  shard_of_.clear();
  first_seen_.clear();
  count_.assign(std::max(1, shards), 0);
  row_of_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    size_t slot = MixRowId(id) & mask;
    while (stamps_[slot] == stamp_ && keys_[slot] != id) slot = (slot + 1) & mask;
    if (stamps_[slot] != stamp_) {
      stamps_[slot] = stamp_;
      keys_[slot] = id;
      values_[slot] = static_cast<uint32_t>(seen_.size());
      const int shard = RowShard(id, shards);
      seen_.push_back(id);
      shard_of_.push_back(shard);
      first_seen_.push_back(static_cast<uint32_t>(i));
      ++count_[shard];
    }
    row_of_[i] = values_[slot];  // the order first seen, until the rows are laid out by shard
  }
  // Shard by shard, each shard's ids in the order first seen.
  begin_.resize(count_.size());
  size_t at = 0;
  for (size_t s = 0; s < count_.size(); ++s) {
    begin_[s] = at;
    at += count_[s];
  }
  next_.assign(begin_.begin(), begin_.end());
  const size_t d = seen_.size();
  ids_.resize(d);
  row_of_seen_.resize(d);
  first_at_.resize(d);
  for (size_t u = 0; u < d; ++u) {
    const size_t r = next_[shard_of_[u]]++;
    ids_[r] = seen_[u];
    row_of_seen_[u] = static_cast<uint32_t>(r);
    first_at_[r] = first_seen_[u];
  }
  for (size_t i = 0; i < n; ++i) row_of_[i] = row_of_seen_[row_of_[i]];
  identity_ = d == n && (n == 0 || count_[shard_of_[0]] == n);
}

void RowBatch::Scatter(const float* distinct_rows, int dim, float* rows) const {
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (size_t i = 0; i < row_of_.size(); ++i) {
    std::memcpy(rows + i * dim, distinct_rows + static_cast<size_t>(row_of_[i]) * dim, row_bytes);
  }
}

void RowBatch::Sum(const float* rows, int dim, float* distinct_rows) const {
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (size_t i = 0; i < row_of_.size(); ++i) {
    const uint32_t r = row_of_[i];
    float* to = distinct_rows + static_cast<size_t>(r) * dim;
    const float* from = rows + i * dim;
    if (first_at_[r] == i) {
      std::memcpy(to, from, row_bytes);
    } else {
      for (int k = 0; k < dim; ++k) to[k] += from[k];
    }
  }
}

}  // namespace summa::worker
