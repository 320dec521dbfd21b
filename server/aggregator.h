// Aggregator: sums one partition's gradient pushes for the current step as they arrive, in one
// buffer of the partition's size (memory independent of the number of workers). The first push
// is copied, later ones added. Not thread-safe: its owner holds the partition's lock.
#ifndef SUMMA_SERVER_AGGREGATOR_H_
#define SUMMA_SERVER_AGGREGATOR_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace summa::server {

class Aggregator {
 public:
  // Allocates and touches the buffer once; steps reuse it.
  explicit Aggregator(int64_t length);

  // `gradient` must have the partition's length (the caller validated it). With
  // `zero_nonfinite`, NaN and infinite entries are added as zero.
  void Add(absl::Span<const float> gradient, int64_t num_examples, bool zero_nonfinite = false);

  // Counts examples whose values were not added (a push skipped under --nonfinite=skip_step).
  void AddExamples(int64_t num_examples) { num_examples_ += num_examples; }

  absl::Span<const float> sum() const { return sum_; }
  int64_t num_examples() const { return num_examples_; }
  int contributions() const { return contributions_; }

  // Starts the next step; the next Add copies instead of adding.
  void Reset();

 private:
  std::vector<float> sum_;
  int64_t num_examples_ = 0;
  int contributions_ = 0;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_AGGREGATOR_H_
