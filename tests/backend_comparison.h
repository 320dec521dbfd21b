// The means of tests/backend_checks.h: checks that return an AssertionResult naming the first
// thing that differs (the SUMMA_CHECK macros), random inputs, a comparison relative to the
// reference tensor's largest |value|, and host values staged to and from a backend's memory.
#ifndef SUMMA_TESTS_BACKEND_COMPARISON_H_
#define SUMMA_TESTS_BACKEND_COMPARISON_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace summa::worker::checks {

// Returns a failure from the enclosing check when `expr` (a Status) is not OK.
#define SUMMA_CHECK_OK(expr)                                                              \
  do {                                                                                    \
    const absl::Status summa_check_status_ = (expr);                                      \
    if (!summa_check_status_.ok()) {                                                      \
      return ::testing::AssertionFailure() << #expr << ": " << summa_check_status_;       \
    }                                                                                     \
  } while (0)
#define SUMMA_CHECK_CONCAT_INNER(a, b) a##b
#define SUMMA_CHECK_CONCAT(a, b) SUMMA_CHECK_CONCAT_INNER(a, b)
#define SUMMA_CHECK_ASSIGN_IMPL(tmp, lhs, expr)                                           \
  auto tmp = (expr);                                                                      \
  if (!tmp.ok()) return ::testing::AssertionFailure() << #expr << ": " << tmp.status();   \
  lhs = *std::move(tmp)
// Assigns the value of `expr` (a StatusOr) to `lhs`, or returns a failure from the check.
#define SUMMA_CHECK_ASSIGN(lhs, expr) \
  SUMMA_CHECK_ASSIGN_IMPL(SUMMA_CHECK_CONCAT(summa_check_or_, __LINE__), lhs, expr)
// Returns `result` from the enclosing check when it is a failure.
#define SUMMA_CHECK(result)                                     \
  do {                                                          \
    ::testing::AssertionResult summa_check_result_ = (result);  \
    if (!summa_check_result_) return summa_check_result_;       \
  } while (0)

inline std::vector<float> Random(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// max |got - want| <= tolerance * max |want|, with want not all zero.
inline ::testing::AssertionResult CloseScaled(const std::vector<float>& got,
                                              const std::vector<float>& want,
                                              const std::string& what, double tolerance) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, want "
                                         << want.size();
  }
  double scale = 0, worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(double{want[i]}));
    const double d = std::abs(double{got[i]} - double{want[i]});
    if (!(d <= worst)) {  // NaN counts as worst
      worst = std::isnan(d) ? INFINITY : d;
      worst_at = i;
    }
  }
  if (!(scale > 0)) {
    return ::testing::AssertionFailure()
           << what << ": the reference is all zero, so the comparison would prove nothing";
  }
  if (!(worst <= tolerance * scale)) {
    return ::testing::AssertionFailure()
           << what << ": element " << worst_at << " is " << got[worst_at] << ", want "
           << want[worst_at] << " (off by " << worst / scale << " of the tensor's largest |value| "
           << scale << "; tolerance " << tolerance << ")";
  }
  return ::testing::AssertionSuccess();
}

// Host values to and from one backend's memory.
class Staging {
 public:
  explicit Staging(Backend* backend) : backend_(backend) {}
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> On(const std::vector<float>& host) {
    auto b = backend_->Alloc(static_cast<int64_t>(host.size()));
    if (!b.ok()) return b.status();
    absl::Status s = backend_->Upload(host.data(), static_cast<int64_t>(host.size()), (*b)->data());
    if (!s.ok()) return s;
    return b;
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Zeros(int64_t n) { return backend_->Alloc(n); }
  absl::StatusOr<std::vector<float>> Back(const DeviceBuffer& b) {
    std::vector<float> host(b.size());
    absl::Status s = backend_->Download(b.data(), b.size(), host.data());
    if (!s.ok()) return s;
    return host;
  }

 private:
  Backend* backend_;  // Not owned.
};

}  // namespace summa::worker::checks

#endif  // SUMMA_TESTS_BACKEND_COMPARISON_H_
