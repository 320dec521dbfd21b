#include "worker/sharding.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace summa::worker {

std::vector<int64_t> EpochOrder(int64_t count, uint64_t seed, int epoch) {
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  // Our own Fisher-Yates over mt19937_64: std::shuffle's algorithm is the library's choice, and
  // every worker must produce the same order.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = count - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

int64_t StepsPerEpoch(int64_t count, int64_t batch_size) {
  return (count + batch_size - 1) / batch_size;
}

ShardRange ShardOf(int64_t count, int64_t batch_size, int64_t step, int rank, int world) {
  const int64_t start = step * batch_size;
  const int64_t b = std::max<int64_t>(0, std::min(batch_size, count - start));
  return {start + rank * b / world, start + (rank + 1) * b / world};
}

}  // namespace summa::worker
