// Aggregator: sums one partition's gradient pushes for the current step. By default as they
// arrive, in one buffer of the partition's size (memory independent of the number of workers):
// the first push is copied, later ones added. Float addition is not associative, so with three
// or more workers that sum's last bits depend on the order the pushes arrived in. Deterministic
// (`ranks` > 0, `--deterministic`): each rank's push is kept in a slot of its own and Finish()
// sums the slots in rank order, so a step's sum is the same bits whatever the arrival order, at
// the cost of one partition-sized slot per rank and one more pass over the pushes.
// Not thread-safe: its owner holds the partition's lock.
#ifndef SUMMA_SERVER_CORE_AGGREGATOR_H_
#define SUMMA_SERVER_CORE_AGGREGATOR_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace summa::server {

class Aggregator {
 public:
  // Allocates and touches its buffers once (the sum, and a slot per rank when `ranks` > 0); steps
  // reuse them.
  explicit Aggregator(int64_t length, int ranks = 0);

  // `gradient` must have the partition's length and `rank` be in [0, ranks) when deterministic
  // (the caller validated both). With `zero_nonfinite`, NaN and infinite entries count as zero.
  void Add(int rank, absl::Span<const float> gradient, int64_t num_examples, bool zero_nonfinite = false);

  // Counts examples whose values were not added (a push skipped under --nonfinite=skip_step).
  void AddExamples(int64_t num_examples) { num_examples_ += num_examples; }

  // Makes sum() the step's sum: when deterministic, the kept pushes added in rank order.
  void Finish();

  absl::Span<const float> sum() const { return sum_; }
  int64_t num_examples() const { return num_examples_; }
  int contributions() const { return contributions_; }
  bool deterministic() const { return !kept_.empty(); }

  // Starts the next step; the next Add copies instead of adding.
  void Reset();

 private:
  std::vector<float> sum_;
  std::vector<float> slots_;  // deterministic: rank r's push at [r * length, (r + 1) * length)
  std::vector<bool> kept_;    // deterministic: which ranks pushed this step
  int64_t num_examples_ = 0;
  int contributions_ = 0;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_AGGREGATOR_H_
