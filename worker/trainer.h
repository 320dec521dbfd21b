// Trainer: the seed's train(num_gpus, batch_size, lr) as one worker of a job. Joins the server
// (rank 0 supplies the initial weights), resumes at the server's version, and for each step
// computes its shard's gradient, push-pulls it, and loads the next version; after each epoch it
// evaluates test accuracy and prints the seed's line. Owns nothing it is given. Not thread-safe.
#ifndef SUMMA_WORKER_TRAINER_H_
#define SUMMA_WORKER_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/idx.h"
#include "worker/backend.h"
#include "worker/ps_client.h"
#include "worker/status_board.h"

namespace summa::worker {

struct TrainerOptions {
  int rank = 0;  // -1: the server assigns one
  int world_size = 1;
  int64_t batch_size = 256;  // the global minibatch, split across the world
  int epochs = 10;
  uint64_t seed = 0;           // initial weights and the epochs' shuffles
  bool progress_bar = false;   // redraw a bar with examples/s (on a terminal)
  bool evaluate = true;        // test accuracy after each epoch
  std::string status_address;  // told to the server, for operators
};

struct EpochResult {
  int epoch = 0;  // 1-based
  double loss = 0;  // mean training loss over the whole job's examples
  double test_accuracy = 0;
  double seconds = 0;  // training only, as the seed times it
  double examples_per_second = 0;
};

class Trainer {
 public:
  // None owned; all outlive the trainer. `test` may be null when options.evaluate is false.
  Trainer(TrainerOptions options, const Dataset* train, const Dataset* test, Backend* backend,
          ParameterClient* client, StatusBoard* board, std::FILE* out);

  absl::Status Run();

  const std::vector<EpochResult>& results() const { return results_; }
  // The weights after the last step (flat, LeNet order).
  const std::vector<float>& weights() const { return weights_; }
  int rank() const { return rank_; }

 private:
  absl::StatusOr<double> TestAccuracy(class LeNet& model);
  absl::StatusOr<std::string> DeviceList();
  void DrawProgress(int epoch, int64_t done, int64_t total, double rate);

  const TrainerOptions options_;
  const Dataset* const train_;   // Not owned.
  const Dataset* const test_;    // Not owned.
  Backend* const backend_;       // Not owned.
  ParameterClient* const client_;  // Not owned.
  StatusBoard* const board_;     // Not owned.
  std::FILE* const out_;         // Not owned.
  int rank_ = -1;
  std::vector<float> weights_, gradients_, images_, labels_;
  std::vector<EpochResult> results_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_TRAINER_H_
