// Every layer's backward on the CPU backend against central finite differences of a scalar
// loss L = sum(r * y) with fixed random r, computed in float64 from the forward pass.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <xmmintrin.h>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace summa::worker {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Checks analytic[i] == d loss / d param[i] for every i, by central differences.
void ExpectGradient(std::vector<float>& param, const std::vector<float>& analytic,
                    const std::function<double()>& loss, const char* what, double eps = 1e-2) {
  ASSERT_EQ(param.size(), analytic.size());
  for (size_t i = 0; i < param.size(); ++i) {
    const float saved = param[i];
    param[i] = saved + eps;
    const double up = loss();
    param[i] = saved - eps;
    const double down = loss();
    param[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-3 * std::abs(numeric)) << what << " element " << i;
  }
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = NewCpuBackend(1);
};

TEST_F(CpuBackendTest, GemmMatchesNaiveProductInAllTranspositions) {
  const int m = 3, n = 4, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
      std::vector<float> expect(m * n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int l = 0; l < k; ++l) {
            s += double(ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
          }
          expect[i * n + j] = float(2.0 * s + 0.5 * c[i * n + j]);
        }
      }
      ASSERT_TRUE(be_->Gemm(ta, tb, m, n, k, 2.0f, a.data(), b.data(), 0.5f, c.data()).ok());
      for (int i = 0; i < m * n; ++i) EXPECT_NEAR(c[i], expect[i], 1e-5) << ta << tb << i;
    }
  }
}

// A 3x3 kernel (im2col) and a 5x5 one (Winograd, its 4x3 output in partial tiles). The loss is
// linear in each parameter, so a wide step is exact and keeps the forward pass's rounding (larger
// by Winograd's transforms) out of the difference.
TEST_F(CpuBackendTest, Conv2dBackwardMatchesFiniteDifferences) {
  for (const ConvShape& s : {ConvShape{2, 3, 6, 5, 4, 3}, ConvShape{2, 3, 8, 7, 4, 5}}) {
    SCOPED_TRACE(s.kernel == 3 ? "3x3 kernel" : "5x5 kernel");
    const int64_t xsize = int64_t{s.batch} * s.in_channels * s.height * s.width;
    std::vector<float> x = Random(xsize, 4),
                       w = Random(s.out_channels * s.in_channels * s.kernel * s.kernel, 5),
                       b = Random(s.out_channels, 6);
    const int64_t ysize = int64_t{s.batch} * s.out_channels * s.pixels();
    const std::vector<float> r = Random(ysize, 7);
    std::vector<float> y(ysize), ws(s.workspace_floats());
    auto loss = [&] {
      EXPECT_TRUE(be_->Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), ws.data()).ok());
      return Dot(r, y);
    };
    // Reusing the forward pass's columns, then rebuilding them over a workspace of NaNs.
    for (const bool columns_ready : {true, false}) {
      SCOPED_TRACE(columns_ready ? "columns ready" : "columns rebuilt");
      loss();
      if (!columns_ready) std::fill(ws.begin(), ws.end(), std::nanf(""));
      std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
      ASSERT_TRUE(be_->Conv2dBackward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(),
                                      db.data(), ws.data(), columns_ready).ok());
      ExpectGradient(x, dx, loss, "dx", 0.25);
      ExpectGradient(w, dw, loss, "dw", 0.25);
      ExpectGradient(b, db, loss, "dbias", 0.25);
    }
  }
}

// max |got - want| <= tolerance * max |want|.
void ExpectCloseScaled(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                       double tolerance) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::abs(v));
  ASSERT_GT(scale, 0) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * scale) << what << " element " << i;
  }
}

// Winograd's F(3x3, 5x5) against im2col, the direct method, over a workspace of NaNs: LeNet's
// second convolution; a group of 16 images and one of 1 with outputs that end mid-tile; fewer
// kernels than one vector's 16 lanes; a single image. Measured worst errors: y 2.7e-6, dx 4.4e-6,
// dw 1.3e-5 (sums over every tile of the batch) of the largest value; the bias gradient is
// summed as im2col's is, bit for bit.
TEST_F(CpuBackendTest, WinogradMatchesIm2colOnEveryOutputAndGradient) {
  auto direct = NewCpuBackend(1, nullptr, ConvMethod::kIm2col);
  for (const ConvShape& s : {ConvShape{16, 20, 13, 13, 50, 5}, ConvShape{17, 3, 11, 14, 5, 5},
                             ConvShape{2, 2, 5, 9, 3, 5}, ConvShape{1, 4, 12, 8, 7, 5}}) {
    SCOPED_TRACE(testing::Message() << "batch " << s.batch << ", " << s.in_channels << "x"
                                    << s.height << "x" << s.width << " -> " << s.out_channels);
    const int64_t xsize = int64_t{s.batch} * s.in_channels * s.height * s.width;
    const int64_t ysize = int64_t{s.batch} * s.out_channels * s.pixels();
    const std::vector<float> x = Random(xsize, 21),
                             w = Random(s.out_channels * s.in_channels * 25, 22, 0.1f),
                             b = Random(s.out_channels, 23), dy = Random(ysize, 24);
    std::vector<float> y(ysize), dx(xsize), dw(w.size()), db(b.size()), ws(s.workspace_floats());
    ASSERT_TRUE(direct->Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), ws.data()).ok());
    ASSERT_TRUE(direct->Conv2dBackward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                                       db.data(), ws.data(), true).ok());
    for (const bool columns_ready : {true, false}) {
      SCOPED_TRACE(columns_ready ? "transform ready" : "transform rebuilt");
      std::vector<float> y2(ysize, std::nanf("")), dx2(xsize, std::nanf("")),
          dw2(w.size(), std::nanf("")), db2(b.size(), std::nanf(""));
      std::fill(ws.begin(), ws.end(), std::nanf(""));
      ASSERT_TRUE(be_->Conv2dForward(s, x.data(), w.data(), b.data(), y2.data(), ws.data()).ok());
      if (!columns_ready) std::fill(ws.begin(), ws.end(), std::nanf(""));
      ASSERT_TRUE(be_->Conv2dBackward(s, x.data(), w.data(), dy.data(), dx2.data(), dw2.data(),
                                      db2.data(), ws.data(), columns_ready).ok());
      ExpectCloseScaled(y2, y, "y", 1e-5);
      ExpectCloseScaled(dx2, dx, "dx", 1e-5);
      ExpectCloseScaled(dw2, dw, "dw", 5e-5);
      ExpectCloseScaled(db2, db, "dbias", 0);
    }
  }
}

// The direct single-channel 3x3 convolution against im2col, over outputs and a workspace of NaNs:
// LeNet's first convolution (26 columns: two overlapping vectors); rows of exactly one vector;
// three vectors (an odd count) with one output channel (an odd count) and two output rows.
// Measured worst errors: y 1.7e-7, dw 5.4e-7, dbias 8.6e-7 of the largest value. Asked for the
// input gradient as well, the backend computes every gradient by im2col, whatever the forward
// pass left in the workspace: bit for bit the reference's.
TEST_F(CpuBackendTest, DirectConvolutionMatchesIm2colOnEveryOutputAndGradient) {
  auto reference = NewCpuBackend(1, nullptr, ConvMethod::kIm2col);
  for (const ConvShape& s : {ConvShape{16, 1, 28, 28, 20, 3}, ConvShape{3, 1, 18, 18, 4, 3},
                             ConvShape{2, 1, 4, 35, 1, 3}, ConvShape{5, 1, 7, 40, 3, 3}}) {
    SCOPED_TRACE(testing::Message() << "batch " << s.batch << ", " << s.height << "x" << s.width
                                    << " -> " << s.out_channels);
    const int64_t xsize = int64_t{s.batch} * s.height * s.width;
    const int64_t ysize = int64_t{s.batch} * s.out_channels * s.pixels();
    const std::vector<float> x = Random(xsize, 31), w = Random(s.out_channels * 9, 32, 0.3f),
                             b = Random(s.out_channels, 33), dy = Random(ysize, 34);
    std::vector<float> y(ysize), dx(xsize), dw(w.size()), db(b.size()), ws(s.workspace_floats());
    ASSERT_TRUE(reference->Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), ws.data()).ok());
    ASSERT_TRUE(reference->Conv2dBackward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                                          db.data(), ws.data(), false).ok());
    std::vector<float> y2(ysize, std::nanf("")), dw2(w.size(), std::nanf("")),
        db2(b.size(), std::nanf(""));
    std::fill(ws.begin(), ws.end(), std::nanf(""));
    ASSERT_TRUE(be_->Conv2dForward(s, x.data(), w.data(), b.data(), y2.data(), ws.data()).ok());
    ASSERT_TRUE(be_->Conv2dBackward(s, x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data(),
                                    ws.data(), true).ok());
    ExpectCloseScaled(y2, y, "y", 1e-6);
    ExpectCloseScaled(dw2, dw, "dw", 5e-6);
    ExpectCloseScaled(db2, db, "dbias", 5e-6);
    std::vector<float> dx3(xsize, std::nanf("")), dw3(w.size(), std::nanf("")),
        db3(b.size(), std::nanf(""));
    ASSERT_TRUE(be_->Conv2dBackward(s, x.data(), w.data(), dy.data(), dx3.data(), dw3.data(),
                                    db3.data(), ws.data(), true).ok());
    EXPECT_EQ(dx3, dx);
    EXPECT_EQ(dw3, dw);
    EXPECT_EQ(db3, db);
  }
}

// The fused operations are the operations they name bit for bit, on the convolutions computed
// each way (direct, Winograd, im2col) and on pooling with odd edges: ReLU applied to the same
// values, pooling's additions in the same order.
TEST_F(CpuBackendTest, FusedOperationsAreTheOperationsTheyNameBitForBit) {
  // Direct (pooled in the same pass: 26 columns, and 34 in three vectors), direct with an odd
  // output (pooled apart), Winograd, im2col.
  for (const ConvShape& s : {ConvShape{4, 1, 28, 28, 6, 3}, ConvShape{2, 1, 6, 36, 3, 3},
                             ConvShape{3, 1, 7, 19, 4, 3}, ConvShape{17, 3, 11, 14, 5, 5},
                             ConvShape{2, 2, 7, 6, 3, 3}}) {
    SCOPED_TRACE(testing::Message() << s.in_channels << "x" << s.height << "x" << s.width
                                    << ", kernel " << s.kernel);
    const int64_t ysize = int64_t{s.batch} * s.out_channels * s.pixels();
    const std::vector<float> x = Random(int64_t{s.batch} * s.in_channels * s.height * s.width, 41),
                             w = Random(int64_t{s.out_channels} * s.in_channels * s.kernel * s.kernel, 42, 0.3f),
                             b = Random(s.out_channels, 43);
    std::vector<float> ws(s.workspace_floats()), want(ysize), got(ysize, std::nanf(""));
    ASSERT_TRUE(be_->Conv2dForward(s, x.data(), w.data(), b.data(), want.data(), ws.data()).ok());
    ASSERT_TRUE(be_->ReluForward(want.data(), want.data(), ysize).ok());
    ASSERT_TRUE(be_->Conv2dReluForward(s, x.data(), w.data(), b.data(), got.data(), ws.data()).ok());
    ASSERT_GT(std::count(want.begin(), want.end(), 0.0f), ysize / 4);  // ReLU did something
    EXPECT_EQ(got, want);
    // And pooled, where the shape has a pooled output.
    const int64_t psize = int64_t{s.batch} * s.out_channels * (s.out_height() / 2) * (s.out_width() / 2);
    std::vector<float> pooled_want(psize), pooled_got(psize, std::nanf("")), relu_got(ysize, std::nanf(""));
    ASSERT_TRUE(be_->AvgPool2Forward(want.data(), pooled_want.data(), s.batch * s.out_channels, s.out_height(),
                                     s.out_width()).ok());
    ASSERT_TRUE(be_->Conv2dReluPoolForward(s, x.data(), w.data(), b.data(), relu_got.data(), pooled_got.data(),
                                           ws.data()).ok());
    EXPECT_EQ(relu_got, want);
    EXPECT_EQ(pooled_got, pooled_want);
  }
  const int planes = 3, h = 7, w = 6;
  const std::vector<float> y = Random(planes * h * w, 44), dy = Random(planes * (h / 2) * (w / 2), 45);
  std::vector<float> want(y.size()), got(y.size(), std::nanf(""));
  ASSERT_TRUE(be_->AvgPool2Backward(dy.data(), want.data(), planes, h, w).ok());
  ASSERT_TRUE(be_->ReluBackward(y.data(), want.data(), want.data(), int64_t(want.size())).ok());
  ASSERT_TRUE(be_->AvgPool2ReluBackward(y.data(), dy.data(), got.data(), planes, h, w).ok());
  ASSERT_GT(std::count(want.begin(), want.end(), 0.0f), planes * h * w / 3);
  EXPECT_EQ(got, want);
}

TEST_F(CpuBackendTest, LinearBackwardMatchesFiniteDifferences) {
  const int n = 3, in = 5, out = 4;
  std::vector<float> x = Random(n * in, 8), w = Random(in * out, 9), b = Random(out, 10);
  const std::vector<float> r = Random(n * out, 11);
  std::vector<float> y(n * out);
  auto loss = [&] {
    EXPECT_TRUE(be_->LinearForward(x.data(), w.data(), b.data(), y.data(), n, in, out).ok());
    return Dot(r, y);
  };
  std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
  ASSERT_TRUE(be_->LinearBackward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), n,
                                  in, out).ok());
  ExpectGradient(x, dx, loss, "dx");
  ExpectGradient(w, dw, loss, "dw");
  ExpectGradient(b, db, loss, "dbias");
}

TEST_F(CpuBackendTest, AvgPoolBackwardMatchesFiniteDifferencesWithOddEdges) {
  const int planes = 2, h = 5, w = 7;
  std::vector<float> x = Random(planes * h * w, 12);
  const std::vector<float> r = Random(planes * (h / 2) * (w / 2), 13);
  std::vector<float> y(r.size());
  auto loss = [&] {
    EXPECT_TRUE(be_->AvgPool2Forward(x.data(), y.data(), planes, h, w).ok());
    return Dot(r, y);
  };
  std::vector<float> dx(x.size(), 99.0f);  // garbage: backward must overwrite every element
  ASSERT_TRUE(be_->AvgPool2Backward(r.data(), dx.data(), planes, h, w).ok());
  ExpectGradient(x, dx, loss, "dx");
}

TEST_F(CpuBackendTest, ReluBackwardMatchesFiniteDifferences) {
  std::vector<float> x = Random(50, 14);
  for (float& v : x) v += v > 0 ? 0.05f : -0.05f;  // keep away from the kink
  const std::vector<float> r = Random(50, 15);
  std::vector<float> y(50);
  auto loss = [&] {
    EXPECT_TRUE(be_->ReluForward(x.data(), y.data(), 50).ok());
    return Dot(r, y);
  };
  loss();
  std::vector<float> dx(50);
  ASSERT_TRUE(be_->ReluBackward(y.data(), r.data(), dx.data(), 50).ok());
  ExpectGradient(x, dx, loss, "dx", 1e-3);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyIsSummedAndItsGradientMatches) {
  const int n = 4, c = 10;
  std::vector<float> z = Random(n * c, 16, 3.0f);
  const std::vector<float> labels = {3, 0, 9, 5};
  std::vector<float> dz(n * c), scratch(n * c);
  auto loss = [&] {
    float totals[2] = {0, 0};
    EXPECT_TRUE(be_->SoftmaxCrossEntropy(z.data(), labels.data(), scratch.data(), n, c, totals).ok());
    return static_cast<double>(totals[0]);
  };
  float totals[2] = {1, 0};  // the loss is added to what is there
  ASSERT_TRUE(be_->SoftmaxCrossEntropy(z.data(), labels.data(), dz.data(), n, c, totals).ok());
  double expect = 0;
  for (int i = 0; i < n; ++i) {
    double sum = 0;
    for (int j = 0; j < c; ++j) sum += std::exp(double(z[i * c + j]));
    expect += std::log(sum) - z[i * c + int(labels[i])];
  }
  EXPECT_NEAR(totals[0], 1 + expect, 1e-4);
  EXPECT_EQ(totals[1], 0);
  ExpectGradient(z, dz, loss, "dlogits", 1e-3);
  const std::vector<float> bad = {3, 0, 10, 5};
  float bad_totals[2] = {0, 0};
  ASSERT_TRUE(be_->SoftmaxCrossEntropy(z.data(), bad.data(), dz.data(), n, c, bad_totals).ok());
  EXPECT_EQ(bad_totals[1], 1);  // label 10 of 10 classes, counted
}

TEST_F(CpuBackendTest, CountCorrectAndAxpy) {
  const std::vector<float> z = {0, 5, 1, /**/ 9, 1, 2};
  EXPECT_EQ(*be_->CountCorrect(z.data(), std::vector<float>{1, 2}.data(), 2, 3), 1);
  std::vector<float> y = {1, 2, 3};
  ASSERT_TRUE(be_->Axpy(-2.0f, std::vector<float>{1, 1, 2}.data(), y.data(), 3).ok());
  EXPECT_EQ(y, (std::vector<float>{-1, 0, -1}));
}

}  // namespace
}  // namespace summa::worker

namespace summa::worker {
namespace {

// Denormals count as zero on every thread that computes: here a thread whose flags are off (as a
// thread that did not create the backend may have them), and OpenBLAS's own workers (2 threads, a
// product big enough to split between them). 256 x 1e-39 would be 2.56e-37, a normal float,
// without DAZ.
TEST(CpuBackendFlushToZeroTest, DenormalsAreZeroOnEveryThreadThatComputes) {
  std::unique_ptr<Backend> backend = NewCpuBackend(2);
  const int n = 256;
  std::vector<float> a(n * n, 1e-39f), b(n * n, 1.0f), c(n * n, -1.0f);
  std::thread other([&] {
    _mm_setcsr(_mm_getcsr() & ~(0x8000u | 0x0040u));  // FTZ and DAZ off
    EXPECT_TRUE(backend->Gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data()).ok());
  });
  other.join();
  int nonzero = 0;
  for (float v : c) nonzero += v != 0.0f;
  EXPECT_EQ(nonzero, 0) << "c[0] = " << c[0] << ", c[last] = " << c.back();
}

}  // namespace
}  // namespace summa::worker
