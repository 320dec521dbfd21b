// RowBatch: where a batch of embedding-table row ids goes before it leaves the client. Each
// distinct id is pulled or pushed once: the batch's distinct ids, grouped by the shard that holds
// them (RowShard, common/row_hash.h), and for every position of the batch the distinct row it
// names, so that pulled rows are scattered back to every position (duplicates included) and
// pushed gradients of one id summed into one row. Its buffers are kept across batches: a batch
// allocates only where it is larger than every one before. Not thread-safe.
#ifndef SUMMA_CLIENT_ROW_BATCH_H_
#define SUMMA_CLIENT_ROW_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace summa::worker {

class RowBatch {
 public:
  // Plans `ids` (fewer than 2^32, duplicates allowed) over `shards` (>= 1) shards.
  void Plan(absl::Span<const uint64_t> ids, int shards);

  size_t size() const { return row_of_.size(); }  // positions: the batch's ids
  size_t distinct() const { return ids_.size(); }
  int shards() const { return static_cast<int>(count_.size()); }
  // The distinct ids, shard by shard: shard s's are [begin(s), begin(s) + count(s)), in the
  // order the batch first names them.
  absl::Span<const uint64_t> ids() const { return ids_; }
  size_t begin(int shard) const { return begin_[shard]; }
  size_t count(int shard) const { return count_[shard]; }
  // The distinct row (an index into ids()) that position i names.
  uint32_t row_of(size_t i) const { return row_of_[i]; }
  // Whether ids() is the batch itself, in order (no id twice, one shard holds them all): rows
  // then move between the caller's buffers and the wire without Scatter or Sum.
  bool identity() const { return identity_; }

  // Copies each of `distinct_rows` (distinct() rows of `dim` floats, ordered as ids()) to every
  // position of `rows` (size() rows) that names it.
  void Scatter(const float* distinct_rows, int dim, float* rows) const;
  // Sums `rows` (size() rows of `dim` floats) into `distinct_rows` (distinct() rows, ordered as
  // ids()): each distinct row the sum of the rows of the positions that name its id, in the
  // order of the positions (a fixed order: the same batch sums to the same bits).
  void Sum(const float* rows, int dim, float* distinct_rows) const;

  // The capacity of the id index (slots), for tests of reuse.
  size_t index_capacity() const { return keys_.size(); }

 private:
  // The index from an id to its distinct row: open addressing, linear probing, a slot in use
  // this batch when its stamp is the batch's (no clearing between batches).
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  std::vector<uint32_t> stamps_;
  uint32_t stamp_ = 0;

  std::vector<uint64_t> ids_;       // the distinct ids, shard by shard
  std::vector<uint32_t> row_of_;    // per position
  std::vector<uint32_t> first_at_;  // per distinct row: the first position naming it
  std::vector<size_t> begin_;       // per shard
  std::vector<size_t> count_;       // per shard
  // Planning's scratch: the distinct ids in the order first named, their shards, their rows.
  std::vector<uint64_t> seen_;
  std::vector<int> shard_of_;
  std::vector<uint32_t> row_of_seen_;
  std::vector<uint32_t> first_seen_;  // the position that first named each
  std::vector<size_t> next_;  // per shard, while the rows are laid out
  bool identity_ = false;
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_ROW_BATCH_H_
