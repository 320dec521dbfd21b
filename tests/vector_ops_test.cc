#include "common/vector_ops.h"

#include <cmath>
#include <cstring>
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

TEST(VectorOpsTest, NonFiniteValuesAreCopiedAndAddedAsZeroAndEveryOtherAsItIs) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {1.5f, std::numeric_limits<float>::quiet_NaN(), -inf, inf, -0.0f,
                                     std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                                     std::numeric_limits<float>::denorm_min(), -2.25f,
                                     -std::numeric_limits<float>::signaling_NaN()};
  const std::vector<float> want = {1.5f, 0.0f, 0.0f, 0.0f, -0.0f, std::numeric_limits<float>::max(),
                                   std::numeric_limits<float>::lowest(), std::numeric_limits<float>::denorm_min(),
                                   -2.25f, 0.0f};
  // Long enough for the vector loop and its tail.
  std::vector<float> in, expected;
  for (int k = 0; k < 13; ++k) {
    in.insert(in.end(), values.begin(), values.end());
    expected.insert(expected.end(), want.begin(), want.end());
  }
  std::vector<float> copied(in.size(), 7.0f);
  CopyFiniteOrZero(absl::MakeSpan(copied), in);
  std::vector<float> summed(in.size(), 1.0f);
  AddFiniteOrZero(absl::MakeSpan(summed), in);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(std::memcmp(&copied[i], &expected[i], sizeof(float)), 0) << i << ": " << copied[i];
    ASSERT_EQ(summed[i], 1.0f + expected[i]) << i;
  }
}

}  // namespace
}  // namespace summa
