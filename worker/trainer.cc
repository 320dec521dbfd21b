#include "worker/trainer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/lenet.h"
#include "worker/sharding.h"

namespace summa::worker {

Trainer::Trainer(TrainerOptions options, const Dataset* train, const Dataset* test,
                 Backend* backend, ParameterClient* client, StatusBoard* board, std::FILE* out)
    : options_(std::move(options)),
      train_(train),
      test_(test),
      backend_(backend),
      client_(client),
      board_(board),
      out_(out) {}

absl::StatusOr<double> Trainer::TestAccuracy(LeNet& model) {
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test_->count; begin += model.max_batch()) {
    const int n = static_cast<int>(std::min<int64_t>(model.max_batch(), test_->count - begin));
    std::vector<float> labels(test_->labels.begin() + begin, test_->labels.begin() + begin + n);
    SUMMA_ASSIGN_OR_RETURN(int64_t c, model.CountCorrect(
                                          test_->images.data() + begin * LeNet::kImageFloats,
                                          labels.data(), n));
    correct += c;
  }
  return test_->count == 0 ? 0.0 : static_cast<double>(correct) / test_->count;
}

// Every worker's device, gathered with the server's AllReduce: each rank writes a code into its
// own slot (1 for cpu, 2 + g for cuda:g).
absl::StatusOr<std::string> Trainer::DeviceList() {
  std::vector<float> slots(options_.world_size, 0.0f);
  const std::string mine = backend_->name();
  slots[rank_] = mine == "cpu" ? 1.0f : 2.0f + std::stoi(mine.substr(mine.find(':') + 1));
  SUMMA_ASSIGN_OR_RETURN(std::vector<float> all,
                         client_->AllReduce("summa.train.devices", options_.world_size, rank_, slots));
  std::vector<std::string> names;
  for (float code : all) {
    names.push_back(code == 1.0f ? "cpu" : absl::StrCat("cuda:", static_cast<int>(code) - 2));
  }
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

void Trainer::DrawProgress(int epoch, int64_t done, int64_t total, double rate) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::fprintf(out_, "\repoch %d/%d [%s%s] %3d%% %8.0f examples/s", epoch, options_.epochs,
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               static_cast<int>(total == 0 ? 100 : 100 * done / total), rate);
  std::fflush(out_);
}

absl::Status Trainer::Run() {
  const int64_t n = train_->count;
  const int64_t batch = options_.batch_size;
  if (batch < options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("global batch ", batch, " is smaller than the ",
                                                   options_.world_size, " workers sharing it"));
  }
  if (train_->rows != LeNet::kImageSide || train_->cols != LeNet::kImageSide) {
    return absl::InvalidArgumentError(absl::StrCat("LeNet needs 28x28 images; the training set has ",
                                                   train_->rows, "x", train_->cols));
  }
  const int max_shard = static_cast<int>((batch + options_.world_size - 1) / options_.world_size);
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<LeNet> model, LeNet::Create(backend_, max_shard, backend_->preferred_chunk()));
  const int64_t params = LeNet::NumParams();
  weights_.assign(params, 0.0f);
  gradients_.assign(params, 0.0f);
  images_.assign(int64_t{max_shard} * LeNet::kImageFloats, 0.0f);
  labels_.assign(max_shard, 0.0f);

  board_->Update([&](WorkerState& s) {
    s.state = "joining";
    s.world_size = options_.world_size;
    s.epochs = options_.epochs;
    s.device = backend_->name();
    s.server = client_->address();
  });
  const std::vector<float> initial = LeNet::InitialWeights(options_.seed);
  SUMMA_ASSIGN_OR_RETURN(JoinInfo joined,
                         client_->Join(options_.rank, options_.world_size, LeNet::Specs(),
                                       options_.rank <= 0 ? initial.data() : nullptr,
                                       options_.status_address));
  rank_ = joined.rank;
  SUMMA_ASSIGN_OR_RETURN(uint64_t version, client_->PullAll(joined.version, weights_.data()));
  SUMMA_RETURN_IF_ERROR(model->SetWeights(weights_.data()));
  SUMMA_ASSIGN_OR_RETURN(std::string devices, DeviceList());

  const int64_t steps_per_epoch = StepsPerEpoch(n, batch);
  const int first_epoch = static_cast<int>(version / steps_per_epoch);
  board_->Update([&](WorkerState& s) {
    s.rank = rank_;
    s.step = version;
    s.state = "training";
  });
  if (version > 0) {
    std::fprintf(out_, "rank %d resumes at step %llu (epoch %d)\n", rank_,
                 static_cast<unsigned long long>(version), first_epoch + 1);
  }

  for (int epoch = first_epoch; epoch < options_.epochs; ++epoch) {
    const std::vector<int64_t> order = EpochOrder(n, options_.seed, epoch);
    const absl::Time start = absl::Now();
    absl::Time last_draw = start;
    double loss_sum = 0;
    int64_t examples = 0;
    int64_t global_examples = 0;
    for (int64_t step = version - int64_t{epoch} * steps_per_epoch; step < steps_per_epoch; ++step) {
      const ShardRange shard = ShardOf(n, batch, step, rank_, options_.world_size);
      for (int64_t i = 0; i < shard.size(); ++i) {
        const int64_t example = order[shard.begin + i];
        std::memcpy(images_.data() + i * LeNet::kImageFloats,
                    train_->images.data() + example * LeNet::kImageFloats,
                    LeNet::kImageFloats * sizeof(float));
        labels_[i] = static_cast<float>(train_->labels[example]);
      }
      SUMMA_ASSIGN_OR_RETURN(double loss, model->ComputeGradients(images_.data(), labels_.data(),
                                                                  static_cast<int>(shard.size())));
      SUMMA_RETURN_IF_ERROR(model->GetGradients(gradients_.data()));
      SUMMA_RETURN_IF_ERROR(client_->PushPull(version, shard.size(), gradients_.data(), weights_.data()));
      SUMMA_RETURN_IF_ERROR(model->SetWeights(weights_.data()));
      ++version;
      loss_sum += loss;
      examples += shard.size();
      global_examples += std::min(batch, n - step * batch);
      const absl::Time now = absl::Now();
      const double rate = global_examples / std::max(1e-9, absl::ToDoubleSeconds(now - start));
      board_->Update([&](WorkerState& s) {
        s.epoch = epoch + 1;
        s.step = version;
        s.examples_per_second = rate;
      });
      if (options_.progress_bar && (now - last_draw > absl::Milliseconds(200) || step + 1 == steps_per_epoch)) {
        DrawProgress(epoch + 1, step + 1, steps_per_epoch, rate);
        last_draw = now;
      }
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (options_.progress_bar) std::fprintf(out_, "\r\033[K");
    // The mean loss over every worker's examples: the seed's allreduce, through the server.
    SUMMA_ASSIGN_OR_RETURN(std::vector<float> totals,
                           client_->AllReduce("summa.train.loss", options_.world_size, rank_,
                                              {static_cast<float>(loss_sum), static_cast<float>(examples)}));
    EpochResult result;
    result.epoch = epoch + 1;
    result.loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
    result.seconds = seconds;
    result.examples_per_second = global_examples / std::max(1e-9, seconds);
    std::string accuracy;
    if (options_.evaluate) {
      board_->Update([](WorkerState& s) { s.state = "evaluating"; });
      SUMMA_ASSIGN_OR_RETURN(result.test_accuracy, TestAccuracy(*model));
      accuracy = absl::StrFormat(", test acc %.3f", result.test_accuracy);
    }
    results_.push_back(result);
    board_->Update([&](WorkerState& s) {
      s.state = "training";
      s.last_loss = result.loss;
      s.last_test_accuracy = result.test_accuracy;
    });
    std::fprintf(out_, "epoch %d/%d: loss %.3f%s, %.1f sec/epoch, %.0f examples/s, %d worker%s on %s\n",
                 result.epoch, options_.epochs, result.loss, accuracy.c_str(), seconds,
                 result.examples_per_second, options_.world_size, options_.world_size == 1 ? "" : "s",
                 devices.c_str());
    std::fflush(out_);
  }
  board_->Update([](WorkerState& s) { s.state = "done"; });
  return absl::OkStatus();
}

}  // namespace summa::worker
