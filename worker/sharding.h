// The seed's split_batch across processes. Every worker walks the same shuffled order of the
// training set (seeded by the job seed and the epoch), cuts it into global batches of B, and rank
// r of N takes examples [r*b/N, (r+1)*b/N) of each batch of b examples (b = B except for a short
// last batch), images with their labels. Pure functions: thread-safe.
#ifndef SUMMA_WORKER_SHARDING_H_
#define SUMMA_WORKER_SHARDING_H_

#include <cstdint>
#include <vector>

namespace summa::worker {

// A permutation of [0, count), the same in every process for the same (seed, epoch).
std::vector<int64_t> EpochOrder(int64_t count, uint64_t seed, int epoch);

// Global batches in an epoch of `count` examples: ceil(count / batch_size).
int64_t StepsPerEpoch(int64_t count, int64_t batch_size);

struct ShardRange {
  int64_t begin = 0;  // position in the epoch order
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Rank `rank` of `world`'s slice of global batch `step` (0-based within the epoch).
ShardRange ShardOf(int64_t count, int64_t batch_size, int64_t step, int rank, int world);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_SHARDING_H_
