#include "common/vector_ops.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace summa {
namespace {

TEST(VectorOpsTest, AddIntoSumsEveryElement) {
  std::vector<float> sum(1037), values(1037);
  for (size_t i = 0; i < sum.size(); ++i) {
    sum[i] = float(i);
    values[i] = float(2 * i + 1);
  }
  AddInto(absl::MakeSpan(sum), values);
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(sum[i], float(3 * i + 1)) << i;
}

TEST(VectorOpsTest, FirstNonFiniteFindsTheFirstAnywhere) {
  std::vector<float> v(3000, 1.0f);
  v[17] = std::numeric_limits<float>::denorm_min();  // finite
  v[18] = std::numeric_limits<float>::max();         // finite
  EXPECT_EQ(FirstNonFinite(v), -1);
  EXPECT_EQ(FirstNonFinite({}), -1);
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{2999}}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> w = v;
      w[at] = bad;
      if (at + 5 < w.size()) w[at + 5] = bad;  // a later one does not hide the first
      EXPECT_EQ(FirstNonFinite(w), static_cast<int64_t>(at)) << "at " << at << " value " << bad;
    }
  }
}

}  // namespace
}  // namespace summa
