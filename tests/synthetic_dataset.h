// A small learnable data set for in-process training tests: 28x28 images of noise with a bright
// band whose row range is the label, so that training makes real progress in a few steps.
#ifndef SUMMA_TESTS_SYNTHETIC_DATASET_H_
#define SUMMA_TESTS_SYNTHETIC_DATASET_H_

#include <cstdint>
#include <random>

#include "common/idx.h"

namespace summa::worker {

inline Dataset SyntheticDataset(int64_t count, uint64_t seed) {
  Dataset set;
  set.count = count;
  set.rows = set.cols = 28;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0, 1);
  set.images.resize(count * 784);
  set.labels.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    set.labels[i] = static_cast<int32_t>(rng() % 10);
    for (int p = 0; p < 784; ++p) {
      set.images[i * 784 + p] = 0.3f * pixel(rng) + ((p / 28) / 3 == set.labels[i] ? 0.7f : 0.0f);
    }
  }
  return set;
}

}  // namespace summa::worker

#endif  // SUMMA_TESTS_SYNTHETIC_DATASET_H_
