// Test helper: one Backend (the candidate: CUDA, or a CPU with a bug planted) against another (the
// reference: the CPU) on the same inputs. Each check returns an AssertionResult that names the
// first thing that differs, so that the same checks run CUDA-vs-CPU where a GPU exists
// (cuda_backend_test.cc) and CPU-vs-CPU everywhere, with and without planted bugs
// (backend_checks_test.cc proves each bug fails the check meant to catch it).
//
// Comparisons are per tensor, relative to the tensor's largest |value| in the reference, and a
// reference tensor that is all zero fails the check: a candidate that writes nothing must not pass
// by matching zeros.
//
// The checks' means (the SUMMA_CHECK macros, Random, CloseScaled, Staging) are in
// backend_comparison.h and the backends that wrap another (ForwardingBackend, DeviceHoppingBackend,
// WithoutRelu) in forwarding_backend.h; this header includes both.
#ifndef SUMMA_TESTS_BACKEND_CHECKS_H_
#define SUMMA_TESTS_BACKEND_CHECKS_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/backend_comparison.h"
#include "tests/forwarding_backend.h"
#include "worker/compute/backend.h"
#include "worker/models/model.h"

namespace summa::worker::checks {

// C = alpha op(A) op(B) + beta C in all four transpositions.
inline ::testing::AssertionResult CheckGemm(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  const int m = 37, n = 29, k = 41;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
      SUMMA_CHECK_ASSIGN(auto da, dev.On(a));
      SUMMA_CHECK_ASSIGN(auto db, dev.On(b));
      SUMMA_CHECK_ASSIGN(auto dc, dev.On(c));
      SUMMA_CHECK_OK(ref.Gemm(ta, tb, m, n, k, 1.5f, a.data(), b.data(), 0.5f, c.data()));
      SUMMA_CHECK_OK(cand.Gemm(ta, tb, m, n, k, 1.5f, da->data(), db->data(), 0.5f, dc->data()));
      SUMMA_CHECK_ASSIGN(auto got, dev.Back(*dc));
      SUMMA_CHECK(CloseScaled(got, c, absl::StrCat("gemm ta=", ta, " tb=", tb), 1e-4));
    }
  }
  return ::testing::AssertionSuccess();
}

// Conv2dForward and Conv2dBackward (y, dx, dw, dbias) on LeNet's two layer shapes.
inline ::testing::AssertionResult CheckConvolution(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  // The third shape's bias gradient sums rows of 20956 columns: several slices, the last one
  // shorter, on CUDA (cuda::RowSums).
  for (const ConvShape& s : {ConvShape{3, 1, 28, 28, 20, 3}, ConvShape{4, 20, 13, 13, 50, 5},
                             ConvShape{31, 1, 28, 28, 20, 3}}) {
    const std::string at = absl::StrCat(" (conv ", s.in_channels, "->", s.out_channels, ")");
    const int64_t xs = int64_t{s.batch} * s.in_channels * s.height * s.width;
    const int64_t ws = int64_t{s.out_channels} * s.in_channels * s.kernel * s.kernel;
    const int64_t ys = int64_t{s.batch} * s.out_channels * s.pixels();
    auto x = Random(xs, 4), w = Random(ws, 5, -0.1f, 0.1f), b = Random(s.out_channels, 6),
         dy = Random(ys, 7);
    std::vector<float> y(ys), dx(xs), dw(ws), db(s.out_channels), work(s.workspace_floats());
    SUMMA_CHECK_OK(ref.Conv2dForward(s, x.data(), w.data(), b.data(), y.data(), work.data()));
    SUMMA_CHECK_OK(ref.Conv2dBackward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                                      db.data(), work.data(), /*columns_ready=*/false));
    SUMMA_CHECK_ASSIGN(auto gx, dev.On(x));
    SUMMA_CHECK_ASSIGN(auto gw, dev.On(w));
    SUMMA_CHECK_ASSIGN(auto gb, dev.On(b));
    SUMMA_CHECK_ASSIGN(auto gdy, dev.On(dy));
    SUMMA_CHECK_ASSIGN(auto gy, dev.Zeros(ys));
    SUMMA_CHECK_ASSIGN(auto gdx, dev.Zeros(xs));
    SUMMA_CHECK_ASSIGN(auto gdw, dev.Zeros(ws));
    SUMMA_CHECK_ASSIGN(auto gdb, dev.Zeros(s.out_channels));
    SUMMA_CHECK_ASSIGN(auto gwork, dev.Zeros(s.workspace_floats()));
    SUMMA_CHECK_OK(cand.Conv2dForward(s, gx->data(), gw->data(), gb->data(), gy->data(), gwork->data()));
    SUMMA_CHECK_ASSIGN(auto got_y, dev.Back(*gy));
    SUMMA_CHECK(CloseScaled(got_y, y, "conv y" + at, 1e-4));
    // First with the columns the forward pass left in the workspace, then rebuilt in a zeroed one.
    for (const bool columns_ready : {true, false}) {
      const std::string how = columns_ready ? ", columns from the forward pass" : ", columns rebuilt";
      if (!columns_ready) SUMMA_CHECK_OK(cand.Zero(gwork->data(), s.workspace_floats()));
      SUMMA_CHECK_OK(cand.Conv2dBackward(s, gx->data(), gw->data(), gdy->data(), gdx->data(),
                                         gdw->data(), gdb->data(), gwork->data(), columns_ready));
      SUMMA_CHECK_ASSIGN(auto got_dx, dev.Back(*gdx));
      SUMMA_CHECK_ASSIGN(auto got_dw, dev.Back(*gdw));
      SUMMA_CHECK_ASSIGN(auto got_db, dev.Back(*gdb));
      SUMMA_CHECK(CloseScaled(got_dx, dx, "conv dx" + at + how, 1e-4));
      SUMMA_CHECK(CloseScaled(got_dw, dw, "conv dw" + at + how, 1e-3));  // sums of up to 2028 products
      SUMMA_CHECK(CloseScaled(got_db, db, "conv dbias" + at + how, 1e-3));
    }
  }
  return ::testing::AssertionSuccess();
}

// 2x2 average pooling forward and backward (odd edges), ReLU forward and backward.
inline ::testing::AssertionResult CheckPoolingAndRelu(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  const int planes = 6, h = 9, w = 9;
  auto x = Random(planes * h * w, 8);
  auto dy = Random(planes * 4 * 4, 9);
  std::vector<float> y(planes * 16), dx(planes * h * w), r(x.size()), dr(x.size());
  SUMMA_CHECK_OK(ref.AvgPool2Forward(x.data(), y.data(), planes, h, w));
  SUMMA_CHECK_OK(ref.AvgPool2Backward(dy.data(), dx.data(), planes, h, w));
  SUMMA_CHECK_OK(ref.ReluForward(x.data(), r.data(), static_cast<int64_t>(x.size())));
  SUMMA_CHECK_OK(ref.ReluBackward(r.data(), x.data(), dr.data(), static_cast<int64_t>(x.size())));
  SUMMA_CHECK_ASSIGN(auto gx, dev.On(x));
  SUMMA_CHECK_ASSIGN(auto gdy, dev.On(dy));
  SUMMA_CHECK_ASSIGN(auto gy, dev.Zeros(y.size()));
  SUMMA_CHECK_ASSIGN(auto gdx, dev.Zeros(dx.size()));
  SUMMA_CHECK_ASSIGN(auto gr, dev.Zeros(r.size()));
  SUMMA_CHECK_ASSIGN(auto gdr, dev.Zeros(dr.size()));
  SUMMA_CHECK_OK(cand.AvgPool2Forward(gx->data(), gy->data(), planes, h, w));
  SUMMA_CHECK_OK(cand.AvgPool2Backward(gdy->data(), gdx->data(), planes, h, w));
  SUMMA_CHECK_OK(cand.ReluForward(gx->data(), gr->data(), static_cast<int64_t>(x.size())));
  SUMMA_CHECK_OK(cand.ReluBackward(gr->data(), gx->data(), gdr->data(), static_cast<int64_t>(x.size())));
  SUMMA_CHECK_ASSIGN(auto got_y, dev.Back(*gy));
  SUMMA_CHECK_ASSIGN(auto got_dx, dev.Back(*gdx));
  SUMMA_CHECK_ASSIGN(auto got_r, dev.Back(*gr));
  SUMMA_CHECK_ASSIGN(auto got_dr, dev.Back(*gdr));
  SUMMA_CHECK(CloseScaled(got_y, y, "pool y", 1e-5));
  SUMMA_CHECK(CloseScaled(got_dx, dx, "pool dx", 1e-5));
  SUMMA_CHECK(CloseScaled(got_r, r, "relu y", 0));
  SUMMA_CHECK(CloseScaled(got_dr, dr, "relu dx", 0));
  return ::testing::AssertionSuccess();
}

// LinearForward and LinearBackward (y, dx, dw, dbias).
inline ::testing::AssertionResult CheckLinear(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  const int n = 7, in = 800, out = 128;
  auto x = Random(n * in, 10), w = Random(in * out, 11, -0.05f, 0.05f), b = Random(out, 12),
       dy = Random(n * out, 13);
  std::vector<float> y(n * out), dx(n * in), dw(in * out), db(out);
  SUMMA_CHECK_OK(ref.LinearForward(x.data(), w.data(), b.data(), y.data(), n, in, out));
  SUMMA_CHECK_OK(ref.LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                                    n, in, out));
  SUMMA_CHECK_ASSIGN(auto gx, dev.On(x));
  SUMMA_CHECK_ASSIGN(auto gw, dev.On(w));
  SUMMA_CHECK_ASSIGN(auto gb, dev.On(b));
  SUMMA_CHECK_ASSIGN(auto gdy, dev.On(dy));
  SUMMA_CHECK_ASSIGN(auto gy, dev.Zeros(y.size()));
  SUMMA_CHECK_ASSIGN(auto gdx, dev.Zeros(dx.size()));
  SUMMA_CHECK_ASSIGN(auto gdw, dev.Zeros(dw.size()));
  SUMMA_CHECK_ASSIGN(auto gdb, dev.Zeros(out));
  SUMMA_CHECK_OK(cand.LinearForward(gx->data(), gw->data(), gb->data(), gy->data(), n, in, out));
  SUMMA_CHECK_OK(cand.LinearBackward(gx->data(), gw->data(), gdy->data(), gdx->data(), gdw->data(),
                                     gdb->data(), n, in, out));
  SUMMA_CHECK_ASSIGN(auto got_y, dev.Back(*gy));
  SUMMA_CHECK_ASSIGN(auto got_dx, dev.Back(*gdx));
  SUMMA_CHECK_ASSIGN(auto got_dw, dev.Back(*gdw));
  SUMMA_CHECK_ASSIGN(auto got_db, dev.Back(*gdb));
  SUMMA_CHECK(CloseScaled(got_y, y, "linear y", 1e-4));
  SUMMA_CHECK(CloseScaled(got_dx, dx, "linear dx", 1e-4));
  SUMMA_CHECK(CloseScaled(got_dw, dw, "linear dw", 1e-4));
  SUMMA_CHECK(CloseScaled(got_db, db, "linear dbias", 1e-4));
  return ::testing::AssertionSuccess();
}

// Softmax cross-entropy: dlogits, and the totals it adds to: the summed loss, and the rows whose
// label is out of range (with zero loss and gradient).
inline ::testing::AssertionResult CheckSoftmaxCrossEntropy(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  auto z = Random(5 * 10, 14, -3, 3);
  const std::vector<float> labels = {1, 0, 9, 4, 4};
  std::vector<float> dz(z.size()), totals = {0, 0};
  SUMMA_CHECK_OK(ref.SoftmaxCrossEntropy(z.data(), labels.data(), dz.data(), 5, 10, totals.data()));
  SUMMA_CHECK_ASSIGN(auto gz, dev.On(z));
  SUMMA_CHECK_ASSIGN(auto glabels, dev.On(labels));
  SUMMA_CHECK_ASSIGN(auto gdz, dev.Zeros(dz.size()));
  SUMMA_CHECK_ASSIGN(auto gtotals, dev.On({100, 0}));  // adds to what is there
  SUMMA_CHECK_OK(cand.SoftmaxCrossEntropy(gz->data(), glabels->data(), gdz->data(), 5, 10, gtotals->data()));
  SUMMA_CHECK_ASSIGN(auto got_totals, dev.Back(*gtotals));
  const double loss = totals[0];
  if (!(std::abs(got_totals[0] - 100 - loss) <= 1e-4 * loss) || got_totals[1] != 0 || totals[1] != 0) {
    return ::testing::AssertionFailure() << "softmax totals " << got_totals[0] << ", " << got_totals[1]
                                         << " (from 100, 0), want " << 100 + loss << ", 0";
  }
  SUMMA_CHECK_ASSIGN(auto got_dz, dev.Back(*gdz));
  SUMMA_CHECK(CloseScaled(got_dz, dz, "softmax dz", 1e-5));
  // Labels 12 and -1 of 10 classes: counted, and their rows add no loss and no gradient.
  SUMMA_CHECK_ASSIGN(auto bad, dev.On({1, 0, 12, 4, -1}));
  SUMMA_CHECK_ASSIGN(auto bad_totals, dev.Zeros(2));
  SUMMA_CHECK_OK(cand.SoftmaxCrossEntropy(gz->data(), bad->data(), gdz->data(), 5, 10, bad_totals->data()));
  SUMMA_CHECK_ASSIGN(auto counted, dev.Back(*bad_totals));
  SUMMA_CHECK_ASSIGN(auto bad_dz, dev.Back(*gdz));
  double good_loss = 0;
  {
    std::vector<float> good_dz(z.size()), good_totals = {0, 0};
    const std::vector<float> three = {1, 0, 4};
    std::vector<float> z3;
    for (int row : {0, 1, 3}) z3.insert(z3.end(), z.begin() + row * 10, z.begin() + row * 10 + 10);
    SUMMA_CHECK_OK(ref.SoftmaxCrossEntropy(z3.data(), three.data(), good_dz.data(), 3, 10, good_totals.data()));
    good_loss = good_totals[0];
  }
  const bool zero_rows = std::all_of(bad_dz.begin() + 20, bad_dz.begin() + 30, [](float v) { return v == 0; }) &&
                         std::all_of(bad_dz.begin() + 40, bad_dz.end(), [](float v) { return v == 0; });
  if (counted[1] != 2 || !(std::abs(counted[0] - good_loss) <= 1e-4 * good_loss) || !zero_rows) {
    return ::testing::AssertionFailure() << "labels 12 and -1 of 10 classes: totals " << counted[0] << ", "
                                         << counted[1] << ", want " << good_loss << ", 2"
                                         << (zero_rows ? "" : "; their rows' gradient is not zero");
  }
  return ::testing::AssertionSuccess();
}

// CountCorrect on logits whose largest entry is planted at the label in a known subset of rows
// (and planted as the smallest in the others), so the answer is known without the reference:
// 300 rows (more than one block of threads on a GPU) with 128 right, then 7 rows with none right
// (a count that is not reset between calls fails), then the same 7 all right.
inline ::testing::AssertionResult CheckCountCorrect(Backend& ref, Backend& cand) {
  Staging dev(&cand);
  const int classes = 10;
  auto count_on = [&](Backend& be, int rows, auto right) -> absl::StatusOr<int64_t> {
    std::vector<float> logits = Random(size_t(rows) * classes, 16 + rows, -3, 3), labels(rows);
    for (int i = 0; i < rows; ++i) {
      labels[i] = float((i * 7) % classes);
      logits[size_t(i) * classes + (i * 7) % classes] = right(i) ? 4.0f : -4.0f;
    }
    if (&be == &ref) return ref.CountCorrect(logits.data(), labels.data(), rows, classes);
    auto gl = dev.On(logits);
    if (!gl.ok()) return gl.status();
    auto glabels = dev.On(labels);
    if (!glabels.ok()) return glabels.status();
    return cand.CountCorrect((*gl)->data(), (*glabels)->data(), rows, classes);
  };
  struct Case {
    int rows;
    bool (*right)(int);
    int64_t want;
  };
  const Case cases[] = {
      {300, [](int i) { return i % 3 == 0 || i % 7 == 0; }, 100 + 43 - 15},
      {7, [](int) { return false; }, 0},
      {7, [](int) { return true; }, 7},
  };
  for (const Case& c : cases) {
    for (Backend* be : {&ref, &cand}) {
      SUMMA_CHECK_ASSIGN(const int64_t got, count_on(*be, c.rows, c.right));
      if (got != c.want) {
        return ::testing::AssertionFailure()
               << (be == &ref ? "reference" : "candidate") << " CountCorrect on " << c.rows
               << " rows: " << got << " right, want " << c.want;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Gather: rows picked by float indices, in any order, repeated, from a table on the device.
inline ::testing::AssertionResult CheckGather(Backend& ref, Backend& cand) {
  (void)ref;
  Staging dev(&cand);
  const int64_t row_floats = 784;
  const auto table = Random(7 * row_floats, 16);
  const std::vector<float> rows = {6, 0, 3, 3, 5};
  SUMMA_CHECK_ASSIGN(auto gtable, dev.On(table));
  SUMMA_CHECK_ASSIGN(auto grows, dev.On(rows));
  SUMMA_CHECK_ASSIGN(auto gout, dev.Zeros(rows.size() * row_floats));
  SUMMA_CHECK_OK(cand.Gather(gtable->data(), row_floats, grows->data(), static_cast<int>(rows.size()),
                             gout->data()));
  SUMMA_CHECK_ASSIGN(auto got, dev.Back(*gout));
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t c = 0; c < row_floats; ++c) {
      const float want = table[static_cast<int64_t>(rows[i]) * row_floats + c];
      if (got[i * row_floats + c] != want) {
        return ::testing::AssertionFailure() << "gather: out[" << i << ", " << c << "] is "
                                             << got[i * row_floats + c] << ", want " << want
                                             << " (row " << rows[i] << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Every operation check above.
inline ::testing::AssertionResult CheckOperations(Backend& ref, Backend& cand) {
  SUMMA_CHECK(CheckGather(ref, cand));
  SUMMA_CHECK(CheckGemm(ref, cand));
  SUMMA_CHECK(CheckConvolution(ref, cand));
  SUMMA_CHECK(CheckPoolingAndRelu(ref, cand));
  SUMMA_CHECK(CheckLinear(ref, cand));
  SUMMA_CHECK(CheckSoftmaxCrossEntropy(ref, cand));
  SUMMA_CHECK(CheckCountCorrect(ref, cand));
  return ::testing::AssertionSuccess();
}

// dst's backend sums a gradient held by src's backend (CopyFromPeer then Axpy).
inline ::testing::AssertionResult CheckPeerSum(Backend& dst, Backend& src) {
  Staging on_dst(&dst), on_src(&src);
  SUMMA_CHECK_ASSIGN(auto a, on_dst.On({1, 2, 3}));
  SUMMA_CHECK_ASSIGN(auto b, on_src.On({10, 20, 30}));
  SUMMA_CHECK_ASSIGN(auto staging, on_dst.Zeros(3));
  SUMMA_CHECK_OK(dst.CopyFromPeer(src, b->data(), 3, staging->data()));
  SUMMA_CHECK_OK(dst.Axpy(1.0f, staging->data(), a->data(), 3));
  SUMMA_CHECK_ASSIGN(auto got, on_dst.Back(*a));
  if (got != std::vector<float>{11, 22, 33}) {
    return ::testing::AssertionFailure() << "peer sum: got " << got[0] << ", " << got[1] << ", "
                                         << got[2] << ", want 11, 22, 33";
  }
  return ::testing::AssertionSuccess();
}

// `steps` SGD steps of the real LeNet (NewModel) on a batch of 64, each backend at its preferred
// chunk. The weights are N(0, 0.1^2), large enough that every layer shapes the loss (at the
// seed's 0.01 the loss is ~64 ln 10 whatever the forward does); every step both models get the
// reference's weights, and the loss and each tensor's gradient must match, relative to that
// tensor's largest |value|. Both then step with the reference's gradient.
//
// Both run with ReLU as the identity (WithoutRelu): ReLU's kink makes the gradient jump where a
// pre-activation crosses zero, and with about a million pre-activations per step some lie within
// rounding of zero, on one side for one backend and on the other for the other. On an H200 one
// such unit moved dW1's element 56 by 3% of the tensor's largest value at step 2, and a CPU whose
// convolution and linear outputs are rounded 1e-6 differently moves the same element the same
// way; no tolerance that still catches a wrong kernel covers that. ReLU itself is held to the
// reference operation by operation (CheckPoolingAndRelu).
inline ::testing::AssertionResult CheckLeNetSteps(Backend& ref_backend, Backend& cand_backend,
                                                  int steps = 3) {
  const int batch = 64;
  WithoutRelu ref(&ref_backend), cand(&cand_backend);
  SUMMA_CHECK_ASSIGN(auto rnet, NewModel("lenet", &ref, batch, ref.preferred_chunk()));
  SUMMA_CHECK_ASSIGN(auto cnet, NewModel("lenet", &cand, batch, cand.preferred_chunk()));
  const std::vector<TensorSpec> specs = rnet->specs();
  std::vector<float> w = NormalWeights(specs, 3, 0.1f);
  const auto images = Random(size_t(batch) * rnet->image_floats(), 15, 0, 1);
  std::vector<float> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = float(i % rnet->classes());
  // The candidate draws the batch from tables on its device, as the trainer does: the examples
  // stored in reverse order, and row indices that undo it.
  const int64_t image_floats = rnet->image_floats();
  std::vector<float> table(images.size()), table_labels(batch), rows(batch);
  for (int i = 0; i < batch; ++i) {
    std::copy_n(images.begin() + i * image_floats, image_floats, table.begin() + (batch - 1 - i) * image_floats);
    table_labels[batch - 1 - i] = labels[i];
    rows[i] = float(batch - 1 - i);
  }
  Staging on_cand(&cand);
  SUMMA_CHECK_ASSIGN(auto ctable, on_cand.On(table));
  SUMMA_CHECK_ASSIGN(auto clabels, on_cand.On(table_labels));
  SUMMA_CHECK_ASSIGN(auto crows, on_cand.On(rows));
  const Examples resident = Examples::Resident(ctable->data(), clabels->data(), crows->data());
  std::vector<float> rg(w.size()), cg(w.size());
  for (int step = 0; step < steps; ++step) {
    SUMMA_CHECK_OK(rnet->SetWeights(w.data()));
    SUMMA_CHECK_OK(cnet->SetWeights(w.data()));
    SUMMA_CHECK_ASSIGN(const double rl, GradientsAndLoss(*rnet, images.data(), labels.data(), batch));
    SUMMA_CHECK_OK(cnet->ComputeGradients(resident, batch));
    SUMMA_CHECK_ASSIGN(const double cl, cnet->TakeLoss());
    if (!(std::abs(cl - rl) <= 1e-4 * std::abs(rl))) {
      return ::testing::AssertionFailure() << "step " << step << ": loss " << cl << ", want " << rl;
    }
    SUMMA_CHECK_OK(rnet->GetGradients(rg.data()));
    SUMMA_CHECK_OK(cnet->GetGradients(cg.data()));
    size_t offset = 0;
    for (const TensorSpec& s : specs) {
      const size_t n = static_cast<size_t>(s.num_elements());
      const std::vector<float> r(rg.begin() + offset, rg.begin() + offset + n);
      const std::vector<float> c(cg.begin() + offset, cg.begin() + offset + n);
      SUMMA_CHECK(CloseScaled(c, r, absl::StrCat("step ", step, ": gradient of ", s.name), 1e-3));
      offset += n;
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.05f * rg[i] / batch;  // without ReLU, 0.5 diverges by step 3
  }
  return ::testing::AssertionSuccess();
}

}  // namespace summa::worker::checks

#endif  // SUMMA_TESTS_BACKEND_CHECKS_H_
