// Backends that wrap another (tests/backend_checks.h's candidates): ForwardingBackend, and the
// wrappers built on it that change one thing.
#ifndef SUMMA_TESTS_FORWARDING_BACKEND_H_
#define SUMMA_TESTS_FORWARDING_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "worker/compute/backend.h"

namespace summa::worker::checks {

// A Backend that forwards every operation to another, for wrappers that change one thing
// (a planted bug, a device switch before every call). The fused operations (Conv2dReluForward,
// Conv2dReluPoolForward, AvgPool2ReluBackward) are not forwarded: Backend's defaults run them as
// the forwarded operations, so that a wrapper that changes one of those (WithoutRelu) changes
// the fused one too.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend* target) : target_(target) {}
  std::string name() const override { return target_->name(); }
  int preferred_chunk() const override { return target_->preferred_chunk(); }
  bool host_memory() const override { return target_->host_memory(); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Alloc(int64_t floats) override {
    Before();
    return target_->Alloc(floats);
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocHost(int64_t floats) override {
    Before();
    return target_->AllocHost(floats);
  }
  absl::Status Upload(const float* host, int64_t n, float* device) override {
    Before();
    return target_->Upload(host, n, device);
  }
  absl::Status Download(const float* device, int64_t n, float* host) override {
    Before();
    return target_->Download(device, n, host);
  }
  absl::Status Zero(float* device, int64_t n) override {
    Before();
    return target_->Zero(device, n);
  }
  absl::Status Gather(const float* table, int64_t row_floats, const float* rows, int n,
                      float* out) override {
    Before();
    return target_->Gather(table, row_floats, rows, n, out);
  }
  absl::Status CopyFromPeer(const Backend& from, const float* src, int64_t n, float* dst) override {
    Before();
    return target_->CopyFromPeer(from, src, n, dst);
  }
  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    Before();
    return target_->Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status Conv2dForward(const ConvShape& shape, const float* x, const float* w,
                             const float* bias, float* y, float* workspace) override {
    Before();
    return target_->Conv2dForward(shape, x, w, bias, y, workspace);
  }
  absl::Status Conv2dBackward(const ConvShape& shape, const float* x, const float* w,
                              const float* dy, float* dx, float* dw, float* dbias,
                              float* workspace, bool columns_ready) override {
    Before();
    return target_->Conv2dBackward(shape, x, w, dy, dx, dw, dbias, workspace, columns_ready);
  }
  absl::Status ReluForward(const float* x, float* y, int64_t n) override {
    Before();
    return target_->ReluForward(x, y, n);
  }
  absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) override {
    Before();
    return target_->ReluBackward(y, dy, dx, n);
  }
  absl::Status AvgPool2Forward(const float* x, float* y, int planes, int h, int w) override {
    Before();
    return target_->AvgPool2Forward(x, y, planes, h, w);
  }
  absl::Status AvgPool2Backward(const float* dy, float* dx, int planes, int h, int w) override {
    Before();
    return target_->AvgPool2Backward(dy, dx, planes, h, w);
  }
  absl::Status LinearForward(const float* x, const float* w, const float* bias, float* y,
                             int batch, int in, int out) override {
    Before();
    return target_->LinearForward(x, w, bias, y, batch, in, out);
  }
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* dbias, int batch, int in, int out) override {
    Before();
    return target_->LinearBackward(x, w, dy, dx, dw, dbias, batch, in, out);
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, float* dlogits,
                                   int batch, int classes, float* totals) override {
    Before();
    return target_->SoftmaxCrossEntropy(logits, labels, dlogits, batch, classes, totals);
  }
  absl::StatusOr<int64_t> CountCorrect(const float* logits, const float* labels, int batch,
                                       int classes) override {
    Before();
    return target_->CountCorrect(logits, labels, batch, classes);
  }
  absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) override {
    Before();
    return target_->Axpy(alpha, x, y, n);
  }

 protected:
  // Runs before every forwarded operation.
  virtual void Before() {}
  Backend* target() const { return target_; }

 private:
  Backend* target_;  // Not owned.
};

// Forwards to `target`, but first runs a small operation on `other` (another device's backend),
// so that `target` finds another device current before each of its operations: one that launches
// without selecting its own device then runs on the wrong one (on a machine with two GPUs).
class DeviceHoppingBackend final : public ForwardingBackend {
 public:
  DeviceHoppingBackend(Backend* target, Backend* other, float* other_buffer)
      : ForwardingBackend(target), other_(other), other_buffer_(other_buffer) {}
  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }

 private:
  void Before() override {
    const absl::Status s = other_->Zero(other_buffer_, 1);
    if (status_.ok()) status_ = s;
  }
  Backend* other_;       // Not owned.
  float* other_buffer_;  // Not owned: one float on other_.
  absl::Status status_;
};

// A backend whose ReLU is the identity (forward and backward), everything else forwarded: a
// network without kinks, whose gradient two backends can match to rounding.
class WithoutRelu final : public ForwardingBackend {
 public:
  explicit WithoutRelu(Backend* target) : ForwardingBackend(target) {}
  absl::Status ReluForward(const float* x, float* y, int64_t n) override { return Copy(x, y, n); }
  absl::Status ReluBackward(const float*, const float* dy, float* dx, int64_t n) override {
    return Copy(dy, dx, n);
  }

 private:
  absl::Status Copy(const float* from, float* to, int64_t n) {
    if (from == to) return absl::OkStatus();
    SUMMA_RETURN_IF_ERROR(target()->Zero(to, n));
    return target()->Axpy(1.0f, from, to, n);
  }
};

}  // namespace summa::worker::checks

#endif  // SUMMA_TESTS_FORWARDING_BACKEND_H_
