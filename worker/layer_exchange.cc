#include "worker/layer_exchange.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa::worker {

LayerExchange::LayerExchange(ParameterClient* client, Model* model, Backend* backend, float* weights,
                             float* gradients, Tracer* tracer)
    : client_(client),
      model_(model),
      backend_(backend),
      weights_(weights),
      gradients_(gradients),
      tracer_(tracer),
      exchange_(client) {}

absl::Status LayerExchange::Plan() {
  if (exchange_.active()) return absl::InternalError("the layers were planned anew while a step was in flight");
  layers_ = model_->layers();
  const std::vector<PartitionRange>& parts = client_->partitions();
  partitions_of_.assign(layers_.size(), {});
  layers_in_.assign(parts.size(), 0);
  int64_t end = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerRange& r = layers_[l];
    if (r.offset != end || r.length <= 0) {
      return absl::InternalError(absl::StrCat("model ", model_->name(), "'s layer ", l, " does not follow the last"));
    }
    end = r.offset + r.length;
    for (size_t p = 0; p < parts.size(); ++p) {
      if (parts[p].offset < end && r.offset < parts[p].offset + parts[p].length) {
        partitions_of_[l].push_back(p);
        ++layers_in_[p];
      }
    }
  }
  if (end != model_->num_params() || partitions_of_.empty() || partitions_of_[0].empty()) {
    return absl::InternalError(absl::StrCat("model ", model_->name(), "'s layers do not cover its parameters"));
  }
  for (size_t p = 0; p < parts.size(); ++p) {
    if (layers_in_[p] == 0) {
      return absl::FailedPreconditionError(absl::StrCat("the server's partition ", parts[p].id,
                                                        " holds no parameter of model ", model_->name()));
    }
  }
  loaded_.assign(layers_.size(), 1);  // the trainer loaded the weights it pulled at the Join
  reported_.assign(layers_.size(), 0);
  begun_ = false;
  return absl::OkStatus();
}

void LayerExchange::BeginCompute(uint64_t step, int64_t num_examples) {
  step_ = step;
  examples_ = num_examples;
  begun_ = false;
}

absl::Status LayerExchange::CheckLayer(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size()) {
    return absl::InternalError(absl::StrCat("layer ", layer, " of ", layers_.size()));
  }
  return absl::OkStatus();
}

absl::Status LayerExchange::BeforeForward(int layer) {
  SUMMA_RETURN_IF_ERROR(CheckLayer(layer));
  if (loaded_[layer]) return absl::OkStatus();
  {
    TraceSpan wait(tracer_, "wait", "worker");
    for (size_t p : partitions_of_[layer]) SUMMA_RETURN_IF_ERROR(exchange_.Wait(p));
  }
  // An Upload may still read the weights after it returns (CUDA's): the exchange writes them
  // again only for a partition made ready after a Download, which waits for the device.
  const LayerRange& r = layers_[layer];
  SUMMA_RETURN_IF_ERROR(backend_->Upload(weights_ + r.offset, r.length, model_->weights()->data() + r.offset));
  loaded_[layer] = 1;
  return absl::OkStatus();
}

absl::Status LayerExchange::GradientReady(int layer) {
  SUMMA_RETURN_IF_ERROR(CheckLayer(layer));
  if (!begun_) SUMMA_RETURN_IF_ERROR(BeginStep());
  if (reported_[layer]) return absl::InternalError(absl::StrCat("layer ", layer, "'s gradients reported twice"));
  const LayerRange& r = layers_[layer];
  SUMMA_RETURN_IF_ERROR(backend_->Download(model_->gradients()->data() + r.offset, r.length, gradients_ + r.offset));
  reported_[layer] = 1;
  for (size_t p : partitions_of_[layer]) {
    if (--left_[p] == 0) exchange_.Ready(p);
  }
  return absl::OkStatus();
}

absl::Status LayerExchange::BeginStep() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!loaded_[l]) {
      return absl::InternalError(absl::StrCat("a gradient was reported before layer ", l, "'s forward"));
    }
  }
  // Every partition of the last step was waited for in this forward: its Finish returns at once,
  // and no call of it reads the gradients from here on.
  SUMMA_RETURN_IF_ERROR(FinishInFlight());
  SUMMA_RETURN_IF_ERROR(exchange_.Begin(step_, examples_, gradients_, weights_));
  begun_ = true;
  loaded_.assign(layers_.size(), 0);
  reported_.assign(layers_.size(), 0);
  left_ = layers_in_;
  return absl::OkStatus();
}

absl::Status LayerExchange::EndCompute() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!begun_ || !reported_[l]) {
      return absl::InternalError(absl::StrCat("step ", step_, "'s compute never reported layer ", l, "'s gradients"));
    }
  }
  begun_ = false;
  exchange_.ReadyAll();  // none left where every layer was reported: the partitions are counted
  return absl::OkStatus();
}

absl::Status LayerExchange::FinishInFlight() {
  if (!exchange_.active()) return absl::OkStatus();
  SUMMA_RETURN_IF_ERROR(exchange_.Finish());
  ++steps_finished_;
  return absl::OkStatus();
}

absl::Status LayerExchange::AwaitGroup(std::vector<int>* live) {
  if (!exchange_.active()) return absl::OkStatus();
  TraceSpan span(tracer_, "exchange", "worker");
  const size_t first = partitions_of_[0].front();
  SUMMA_RETURN_IF_ERROR(exchange_.Wait(first));
  *live = exchange_.live_ranks(first);  // as PushPull: the first partition's reply
  return absl::OkStatus();
}

absl::Status LayerExchange::Settle(std::vector<int>* live) {
  if (exchange_.active()) {
    TraceSpan span(tracer_, "exchange", "worker");
    const size_t first = partitions_of_[0].front();
    SUMMA_RETURN_IF_ERROR(exchange_.Wait(first));
    *live = exchange_.live_ranks(first);
    SUMMA_RETURN_IF_ERROR(FinishInFlight());
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (loaded_[l]) continue;
    const LayerRange& r = layers_[l];
    SUMMA_RETURN_IF_ERROR(backend_->Upload(weights_ + r.offset, r.length, model_->weights()->data() + r.offset));
    loaded_[l] = 1;
  }
  return absl::OkStatus();
}

void LayerExchange::Abandon() {
  begun_ = false;
  if (exchange_.active()) exchange_.Finish().IgnoreError();
}

}  // namespace summa::worker
