// The CUDA backend against the CPU backend on the same inputs: every operation forward and
// backward, a few LeNet steps, and gradient summing across devices. Skips itself (with the
// reason) where no GPU works, as on CI.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/devices.h"
#include "worker/lenet.h"

namespace summa::worker {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void ExpectClose(const std::vector<float>& cuda, const std::vector<float>& cpu, const char* what,
                 float tol = 1e-4f) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(cuda[i], cpu[i], tol * (1 + std::abs(cpu[i]))) << what << " element " << i;
  }
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!BuiltWithCuda() || UsableCudaDevices(&why) == 0) {
      GTEST_SKIP() << "no usable GPU: " << why;
    }
    auto gpu = MakeBackend("cuda:0", 1);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
    cpu_ = NewCpuBackend(1);
  }

  // A device copy of host values.
  std::unique_ptr<DeviceBuffer> On(const std::vector<float>& host) {
    auto b = gpu_->Alloc(host.size());
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(gpu_->Upload(host.data(), host.size(), (*b)->data()).ok());
    return *std::move(b);
  }
  std::unique_ptr<DeviceBuffer> Zeros(size_t n) { return *gpu_->Alloc(n); }
  std::vector<float> Back(const DeviceBuffer& b) {
    std::vector<float> host(b.size());
    EXPECT_TRUE(gpu_->Download(b.data(), b.size(), host.data()).ok());
    return host;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaBackendTest, GemmInAllTranspositions) {
  const int m = 37, n = 29, k = 41;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
      auto da = On(a), db = On(b), dc = On(c);
      ASSERT_TRUE(cpu_->Gemm(ta, tb, m, n, k, 1.5f, a.data(), b.data(), 0.5f, c.data()).ok());
      ASSERT_TRUE(gpu_->Gemm(ta, tb, m, n, k, 1.5f, da->data(), db->data(), 0.5f, dc->data()).ok());
      ExpectClose(Back(*dc), c, "gemm");
    }
  }
}

TEST_F(CudaBackendTest, ConvolutionForwardAndBackward) {
  for (const ConvShape& s : {ConvShape{3, 1, 28, 28, 20, 3}, ConvShape{4, 20, 13, 13, 50, 5}}) {
    const int64_t xs = int64_t{s.batch} * s.in_channels * s.height * s.width;
    const int64_t ws = int64_t{s.out_channels} * s.in_channels * s.kernel * s.kernel;
    const int64_t ys = int64_t{s.batch} * s.out_channels * s.pixels();
    auto x = Random(xs, 4), w = Random(ws, 5, -0.1f, 0.1f), b = Random(s.out_channels, 6), dy = Random(ys, 7);
    std::vector<float> y(ys), dx(xs), dw(ws), db(s.out_channels), work(s.workspace_floats());
    ASSERT_TRUE(cpu_->Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), work.data()).ok());
    ASSERT_TRUE(cpu_->Conv2dBackward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                                     work.data()).ok());
    auto gx = On(x), gw = On(w), gb = On(b), gdy = On(dy);
    auto gy = Zeros(ys), gdx = Zeros(xs), gdw = Zeros(ws), gdb = Zeros(s.out_channels),
         gwork = Zeros(s.workspace_floats());
    ASSERT_TRUE(gpu_->Conv2dForward(s, gx->data(), gw->data(), gb->data(), gy->data(), gwork->data()).ok());
    ASSERT_TRUE(gpu_->Conv2dBackward(s, gx->data(), gw->data(), gdy->data(), gdx->data(), gdw->data(),
                                     gdb->data(), gwork->data()).ok());
    ExpectClose(Back(*gy), y, "conv y");
    ExpectClose(Back(*gdx), dx, "conv dx");
    ExpectClose(Back(*gdw), dw, "conv dw", 1e-3f);
    ExpectClose(Back(*gdb), db, "conv dbias", 1e-3f);
  }
}

TEST_F(CudaBackendTest, ElementwisePoolingLinearAndLoss) {
  const int planes = 6, h = 9, w = 9;
  auto x = Random(planes * h * w, 8);
  auto dy = Random(planes * 4 * 4, 9);
  std::vector<float> y(planes * 16), dx(planes * h * w), r(x.size()), dr(x.size());
  ASSERT_TRUE(cpu_->AvgPool2Forward(x.data(), y.data(), planes, h, w).ok());
  ASSERT_TRUE(cpu_->AvgPool2Backward(dy.data(), dx.data(), planes, h, w).ok());
  ASSERT_TRUE(cpu_->ReluForward(x.data(), r.data(), x.size()).ok());
  ASSERT_TRUE(cpu_->ReluBackward(r.data(), x.data(), dr.data(), x.size()).ok());
  auto gx = On(x), gdy = On(dy), gy = Zeros(y.size()), gdx = Zeros(dx.size()), gr = Zeros(r.size()),
       gdr = Zeros(dr.size());
  ASSERT_TRUE(gpu_->AvgPool2Forward(gx->data(), gy->data(), planes, h, w).ok());
  ASSERT_TRUE(gpu_->AvgPool2Backward(gdy->data(), gdx->data(), planes, h, w).ok());
  ASSERT_TRUE(gpu_->ReluForward(gx->data(), gr->data(), x.size()).ok());
  ASSERT_TRUE(gpu_->ReluBackward(gr->data(), gx->data(), gdr->data(), x.size()).ok());
  ExpectClose(Back(*gy), y, "pool y");
  ExpectClose(Back(*gdx), dx, "pool dx");
  ExpectClose(Back(*gr), r, "relu y");
  ExpectClose(Back(*gdr), dr, "relu dx");

  const int n = 7, in = 800, out = 128;
  auto lx = Random(n * in, 10), lw = Random(in * out, 11, -0.05f, 0.05f), lb = Random(out, 12),
       ldy = Random(n * out, 13);
  std::vector<float> ly(n * out), ldx(n * in), ldw(in * out), ldb(out);
  ASSERT_TRUE(cpu_->LinearForward(lx.data(), lw.data(), lb.data(), ly.data(), n, in, out).ok());
  ASSERT_TRUE(cpu_->LinearBackward(lx.data(), lw.data(), ldy.data(), ldx.data(), ldw.data(), ldb.data(),
                                   n, in, out).ok());
  auto g_lx = On(lx), g_lw = On(lw), g_lb = On(lb), g_ldy = On(ldy), g_ly = Zeros(ly.size()),
       g_ldx = Zeros(ldx.size()), g_ldw = Zeros(ldw.size()), g_ldb = Zeros(out);
  ASSERT_TRUE(gpu_->LinearForward(g_lx->data(), g_lw->data(), g_lb->data(), g_ly->data(), n, in, out).ok());
  ASSERT_TRUE(gpu_->LinearBackward(g_lx->data(), g_lw->data(), g_ldy->data(), g_ldx->data(), g_ldw->data(),
                                   g_ldb->data(), n, in, out).ok());
  ExpectClose(Back(*g_ly), ly, "linear y");
  ExpectClose(Back(*g_ldx), ldx, "linear dx");
  ExpectClose(Back(*g_ldw), ldw, "linear dw");
  ExpectClose(Back(*g_ldb), ldb, "linear dbias");

  auto z = Random(5 * 10, 14, -3, 3);
  const std::vector<float> labels = {1, 0, 9, 4, 4};
  std::vector<float> dz(z.size());
  const double loss = *cpu_->SoftmaxCrossEntropy(z.data(), labels.data(), dz.data(), 5, 10);
  auto gz = On(z), glabels = On(labels), gdz = Zeros(dz.size());
  auto gloss = gpu_->SoftmaxCrossEntropy(gz->data(), glabels->data(), gdz->data(), 5, 10);
  ASSERT_TRUE(gloss.ok()) << gloss.status();
  EXPECT_NEAR(*gloss, loss, 1e-4 * loss);
  ExpectClose(Back(*gdz), dz, "softmax dz");
  EXPECT_EQ(*gpu_->CountCorrect(gz->data(), glabels->data(), 5, 10),
            *cpu_->CountCorrect(z.data(), labels.data(), 5, 10));
  auto bad = On({1, 0, 12, 4, 4});
  EXPECT_FALSE(gpu_->SoftmaxCrossEntropy(gz->data(), bad->data(), gdz->data(), 5, 10).ok());
}

TEST_F(CudaBackendTest, LeNetStepsMatchTheCpu) {
  auto gnet = LeNet::Create(gpu_.get(), 64, gpu_->preferred_chunk());
  auto cnet = LeNet::Create(cpu_.get(), 64, cpu_->preferred_chunk());
  ASSERT_TRUE(gnet.ok() && cnet.ok());
  std::vector<float> w = LeNet::SeedWeights(3);
  std::vector<float> cw = w;
  const auto images = Random(64 * 784, 15, 0, 1);
  std::vector<float> labels(64);
  for (int i = 0; i < 64; ++i) labels[i] = float(i % 10);
  std::vector<float> g(w.size()), cg(w.size());
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE((*gnet)->SetWeights(w.data()).ok());
    ASSERT_TRUE((*cnet)->SetWeights(cw.data()).ok());
    const double gl = *(*gnet)->ComputeGradients(images.data(), labels.data(), 64);
    const double cl = *(*cnet)->ComputeGradients(images.data(), labels.data(), 64);
    EXPECT_NEAR(gl, cl, 1e-4 * cl) << "step " << step;
    ASSERT_TRUE((*gnet)->GetGradients(g.data()).ok());
    ASSERT_TRUE((*cnet)->GetGradients(cg.data()).ok());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] -= 0.5f * g[i] / 64;
      cw[i] -= 0.5f * cg[i] / 64;
    }
  }
  ExpectClose(w, cw, "weights after 5 steps", 1e-3f);
}

TEST_F(CudaBackendTest, GradientsSumAcrossDevices) {
  std::string why;
  const int devices = UsableCudaDevices(&why);
  auto second = MakeBackend(devices > 1 ? "cuda:1" : "cuda:0", 1);
  ASSERT_TRUE(second.ok()) << second.status();
  auto a = On({1, 2, 3});
  auto b = (*second)->Alloc(3);
  ASSERT_TRUE(b.ok());
  const std::vector<float> values = {10, 20, 30};
  ASSERT_TRUE((*second)->Upload(values.data(), 3, (*b)->data()).ok());
  auto staging = Zeros(3);
  ASSERT_TRUE(gpu_->CopyFromPeer(**second, (*b)->data(), 3, staging->data()).ok());
  ASSERT_TRUE(gpu_->Axpy(1.0f, staging->data(), a->data(), 3).ok());
  EXPECT_EQ(Back(*a), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(gpu_->CopyFromPeer(*cpu_, values.data(), 3, staging->data()).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace summa::worker
