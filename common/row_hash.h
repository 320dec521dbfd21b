// Where an embedding table's row lives and how it starts: the one home of both rules, which the
// client (which shard to ask) and every server shard (which rows it holds, after a restore into
// another shard count too) must agree on. Pure functions of the id; no state.
#ifndef SUMMA_COMMON_ROW_HASH_H_
#define SUMMA_COMMON_ROW_HASH_H_

#include <cstdint>

namespace summa {

// SplitMix64's finalizer: every bit of the id moves every bit of the result, so consecutive ids
// (the usual vocabulary) spread evenly over shards.
inline uint64_t MixRowId(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The shard, of `shards` (>= 1), that holds row `id` of every table.
inline int RowShard(uint64_t id, int shards) {
  return shards <= 1 ? 0 : static_cast<int>(MixRowId(id) % static_cast<uint64_t>(shards));
}

}  // namespace summa

#endif  // SUMMA_COMMON_ROW_HASH_H_
