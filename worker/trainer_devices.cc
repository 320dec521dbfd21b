// Trainer: its devices. The training set resident on each, the epoch's order, a shard split
// across them and their gradients summed, the weights in, the loss out, and the evaluation. The
// rest is worker/trainer.cc.
#include "worker/trainer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {

absl::Status Trainer::PrepareResident() {
  const int64_t n = train_->count;
  const int classes = models_[0]->classes();
  if (n > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("the training set's ", n, " examples exceed 2^24 ",
                                                   "(row indices are kept as floats)"));
  }
  train_labels_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = train_->labels[i];
    if (label < 0 || label >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("training example ", i, " has label ", label, "; model ",
                                                     options_.model, " has classes 0..", classes - 1));
    }
    train_labels_[i] = static_cast<float>(label);
  }
  order_rows_.assign(n, 0.0f);
  const int64_t image_floats = int64_t{train_->rows} * train_->cols;
  resident_.clear();
  for (size_t d = 0; d < models_.size(); ++d) {  // a split model takes its examples on its first device
    Backend* const b = backends_[d];
    Resident r;
    if (b->host_memory()) {
      r.image_table = train_->images.data();
      r.label_table = train_labels_.data();
      r.rows = order_rows_.data();
    } else {
      SUMMA_ASSIGN_OR_RETURN(r.images, b->Alloc(n * image_floats));
      SUMMA_ASSIGN_OR_RETURN(r.labels, b->Alloc(n));
      SUMMA_ASSIGN_OR_RETURN(r.order, b->Alloc(n));
      SUMMA_RETURN_IF_ERROR(b->Upload(train_->images.data(), n * image_floats, r.images->data()));
      SUMMA_RETURN_IF_ERROR(b->Upload(train_labels_.data(), n, r.labels->data()));
      r.image_table = r.images->data();
      r.label_table = r.labels->data();
      r.rows = r.order->data();
    }
    resident_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status Trainer::SetOrder(const std::vector<int64_t>& order) {
  // order_rows_ is pageable host memory: an Upload from it has read it before returning (CUDA
  // stages pageable copies), so rewriting it next epoch cannot race the device.
  for (size_t i = 0; i < order.size(); ++i) order_rows_[i] = static_cast<float>(order[i]);
  for (size_t d = 0; d < resident_.size(); ++d) {
    if (resident_[d].order != nullptr) {
      SUMMA_RETURN_IF_ERROR(backends_[d]->Upload(order_rows_.data(), static_cast<int64_t>(order.size()),
                                                 resident_[d].order->data()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::TakeLoss() {
  double loss = 0;
  for (auto& model : models_) {
    SUMMA_ASSIGN_OR_RETURN(double part, model->TakeLoss());
    loss += part;
  }
  return loss;
}

absl::Status Trainer::LoadWeights() {
  for (auto& model : models_) SUMMA_RETURN_IF_ERROR(model->SetWeights(weights_->data()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::ComputeGradients(int64_t begin, int n, int used, const std::vector<int>* summed) {
  const int devices = std::min(used, static_cast<int>(models_.size()));
  const int64_t params = models_[0]->num_params();
  auto computes = [&](int d) {
    return d < devices && (summed == nullptr || std::binary_search(summed->begin(), summed->end(), d));
  };
  int64_t examples = 0;
  for (int d = 0; d < devices; ++d) {
    if (computes(d)) examples += (d + 1) * n / devices - d * n / devices;
  }
  // split_batch again, each device's part on its own thread.
  SUMMA_RETURN_IF_ERROR(device_threads_->Run([&](int d) {
    if (!computes(d)) return absl::OkStatus();
    const int from = d * n / devices, to = (d + 1) * n / devices;
    const Resident& r = resident_[d];
    return models_[d]->ComputeGradients(
        Examples::Resident(r.image_table, r.label_table, r.rows + begin + from), to - from);
  }));
  // The seed's allreduce inside one worker: sum every device's gradient onto the first.
  Backend& first = *backends_[0];
  for (int d = 1; d < devices; ++d) {
    if (!computes(d)) continue;
    SUMMA_RETURN_IF_ERROR(first.CopyFromPeer(*backends_[d], models_[d]->gradients()->data(),
                                             params, peer_gradients_->data()));
    SUMMA_RETURN_IF_ERROR(first.Axpy(1.0f, peer_gradients_->data(), models_[0]->gradients()->data(),
                                     params));
  }
  return examples;
}

absl::StatusOr<double> Trainer::TestAccuracy() {
  Model& model = *models_[0];
  std::vector<float> labels(model.max_batch());
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test_->count; begin += model.max_batch()) {
    const int n = static_cast<int>(std::min<int64_t>(model.max_batch(), test_->count - begin));
    for (int i = 0; i < n; ++i) labels[i] = static_cast<float>(test_->labels[begin + i]);
    SUMMA_ASSIGN_OR_RETURN(int64_t c, model.CountCorrect(
                                          test_->images.data() + begin * model.image_floats(),
                                          labels.data(), n));
    correct += c;
  }
  return test_->count == 0 ? 0.0 : static_cast<double>(correct) / test_->count;
}

}  // namespace summa::worker
