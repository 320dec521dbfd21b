// LayerExchange: the trainer's step exchange overlapped with its compute (summa-worker
// --overlap), for one model on one device. It maps the model's layers (Model::layers()) onto the
// server's partitions (ParameterClient::partitions(): a partition may span several layers and a
// layer several partitions) and, as the model's LayerHooks:
//  - in backward, copies each finished layer's gradients to the host and makes a partition ready
//    (StepExchange::Ready) once every layer it holds is done: the last layers' partitions go out
//    while the first layers' backward still runs;
//  - in the next step's forward, waits before each layer only for the partitions holding its
//    weights, and loads them into the model.
//
// A step s: BeginCompute(s, n), Model::ComputeGradientsPerLayer(..., *this), EndCompute(). Its
// exchange then runs on while the trainer turns to step s+1: AwaitGroup (the group of s+1, from
// the first partition's reply), the next compute, whose forward waits per layer and whose first
// finished layer ends step s's exchange (StepExchange::Finish: the gradients it reads are not
// written before) and begins s+1's. Settle ends the step in flight before anything else reads
// the weights or uses the client; Abandon after an error, before a rejoin.
//
// Borrows everything; the client is the exchange's between a step's Begin and its Finish. Not
// thread-safe: the trainer's thread only (the model calls the hooks on it).
#ifndef SUMMA_WORKER_LAYER_EXCHANGE_H_
#define SUMMA_WORKER_LAYER_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "client/ps_client.h"
#include "client/step_exchange.h"
#include "common/trace.h"
#include "worker/compute/backend.h"
#include "worker/models/model.h"

namespace summa::worker {

class LayerExchange final : public LayerHooks {
 public:
  // `weights` and `gradients`: the host staging buffers (model->num_params() floats each,
  // Backend::AllocHost of `backend`, the model's device) that the exchange pulls into and pushes
  // from. `tracer` (or null) records the waits: before a step and at the epoch's end as
  // "exchange" spans, before each layer's forward as "wait" spans.
  LayerExchange(ParameterClient* client, Model* model, Backend* backend, float* weights, float* gradients,
                Tracer* tracer);

  // After each Join, with the model's weights loaded: maps the layers onto the partitions the
  // server cut (a restarted server may cut them anew). No step may be in flight.
  absl::Status Plan();

  // Step `step` of `num_examples` examples is about to be computed.
  void BeginCompute(uint64_t step, int64_t num_examples);
  // After its compute: INTERNAL where a layer's gradients were never reported; every partition
  // ready.
  absl::Status EndCompute();
  // Waits for the first partition of the step in flight (the next forward's first wait) and sets
  // `live` to the group its reply names: the next step's. Nothing when no step is in flight.
  absl::Status AwaitGroup(std::vector<int>* live);
  // Ends the step in flight, if any: every partition's new weights in the model, `live` the
  // group. Its error where its exchange failed.
  absl::Status Settle(std::vector<int>* live);
  // After an error: ends the step in flight whatever its outcome (its calls have deadlines). The
  // model's weights are then partly the new step's: a rejoin loads them all again.
  void Abandon();
  // Steps whose exchange ended OK, over this object's life.
  uint64_t steps_finished() const { return steps_finished_; }
  // The last finished step's timeline (StepExchange::timeline()).
  std::vector<StepExchange::Times> timeline() const { return exchange_.timeline(); }

  // LayerHooks:
  absl::Status BeforeForward(int layer) override;
  absl::Status GradientReady(int layer) override;

 private:
  // Ends the last step's exchange and begins this one's, at its first finished layer.
  absl::Status BeginStep();
  absl::Status FinishInFlight();
  absl::Status CheckLayer(int layer) const;

  ParameterClient* const client_;  // Not owned.
  Model* const model_;             // Not owned.
  Backend* const backend_;         // Not owned.
  float* const weights_;           // Not owned.
  float* const gradients_;         // Not owned.
  Tracer* const tracer_;           // Not owned; may be null.
  StepExchange exchange_;
  std::vector<LayerRange> layers_;
  std::vector<std::vector<size_t>> partitions_of_;  // per layer: the partitions it overlaps
  std::vector<int> layers_in_;                      // per partition: the layers it overlaps
  // The step being computed.
  uint64_t step_ = 0;
  int64_t examples_ = 0;
  bool begun_ = false;                // its exchange has begun
  std::vector<char> loaded_;          // per layer: the model holds the last exchange's weights
  std::vector<char> reported_;        // per layer: its gradients are on the host
  std::vector<int> left_;             // per partition: layers still to report
  uint64_t steps_finished_ = 0;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_LAYER_EXCHANGE_H_
