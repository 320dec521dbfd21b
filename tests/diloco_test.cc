// DiLoCo (summa-server --mode=diloco) end to end in one process: an in-process server on
// 127.0.0.1:0 and trainers as threads, each with its own backend and client, on a small
// synthetic data set. What it promises: with one local step and outer SGD at rate 1 it is the
// sync job; with H local steps its outer weights are, bit for bit, a replay of the algorithm
// written out here (each rank's local steps over its shards, the pseudo-gradients weighted by
// examples, the outer optimizer); async DiLoCo applies each pseudo-gradient as its share; a
// checkpoint restores only into the same H.
#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "client/ps_client.h"
#include "common/optimizer.h"
#include "server/daemon.h"
#include "server/core/checkpoint_codec.h"
#include "tests/parameter_server_fixtures.h"
#include "tests/in_process_job.h"
#include "tests/parameter_server_peer.h"
#include "tests/synthetic_dataset.h"
#include "worker/models/lenet.h"
#include "worker/models/model.h"
#include "worker/sharding.h"
#include "worker/trainer.h"

namespace summa::worker {
namespace {

constexpr uint64_t kSeed = 11;

using JobRun = InProcessRun;

JobRun Train(const server::ServerOptions& so, int workers, int64_t batch, const Dataset& data, int epochs,
             const OptimizerOptions& inner) {
  EXPECT_EQ(so.world_size, workers);
  return RunInProcess(so, data, /*devices=*/1, [&](TrainerOptions& o, ParameterClient& client) {
    client.set_takes_local_steps(true);  // as summa-worker's
    o.batch_size = batch;
    o.epochs = epochs;
    o.seed = kSeed;
    o.inner = inner;
  });
}

server::ServerOptions Job(int workers, server::Mode mode, int sync_every, OptimizerOptions outer) {
  server::ServerOptions so;
  so.world_size = workers;
  so.mode = mode;
  so.sync_every = sync_every;
  so.optimizer = std::move(outer);
  so.barrier_deadline = absl::Seconds(60);
  return so;
}

OptimizerOptions Sgd(double lr, double momentum = 0, bool nesterov = false) {
  OptimizerOptions o;
  o.name = "sgd";
  o.learning_rate = lr;
  o.momentum = momentum;
  o.nesterov = nesterov;
  return o;
}

OptimizerOptions Adam(double lr) {
  OptimizerOptions o;
  o.name = "adam";
  o.learning_rate = lr;
  return o;
}

// DiLoCo written out from the paper, over the same model code and update rules: each rank's
// weights take the local steps of its shards of global batches [s*H, s*H + H) of the epoch
// (the last exchange of an epoch over the batches left), then the outer optimizer steps the
// anchor by the pseudo-gradients summed (each times its examples) over all the examples.
std::vector<float> Replay(int workers, int64_t batch, const Dataset& data, int epochs, int H,
                          const OptimizerOptions& inner_options, const OptimizerOptions& outer_options) {
  std::unique_ptr<Backend> backend = NewCpuBackend(1);
  auto model = NewModel("lenet", backend.get(), static_cast<int>(batch), backend->preferred_chunk());
  EXPECT_TRUE(model.ok()) << model.status();
  const int64_t params = (*model)->num_params();
  std::vector<float> outer = (*model)->InitialWeights(kSeed);
  auto outer_opt = Optimizer::Create(outer_options);
  auto inner_opt = Optimizer::Create(inner_options);
  EXPECT_TRUE(outer_opt.ok() && inner_opt.ok());
  auto spans = [](std::vector<std::vector<float>>& slots) {
    std::vector<absl::Span<float>> out;
    for (auto& s : slots) out.emplace_back(s);
    return out;
  };
  std::vector<std::vector<float>> outer_slots((*outer_opt)->SlotNames().size(), std::vector<float>(params));
  // Each rank's inner state lives across exchanges.
  std::vector<std::vector<std::vector<float>>> inner_slots(
      workers, std::vector<std::vector<float>>((*inner_opt)->SlotNames().size(), std::vector<float>(params)));
  std::vector<uint64_t> inner_updates(workers, 0);
  std::vector<float> labels(data.labels.begin(), data.labels.end());
  std::vector<float> grad(params), sum(params);
  const int64_t batches = StepsPerEpoch(data.count, batch);
  uint64_t t = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> order = EpochOrder(data.count, kSeed, epoch);
    const std::vector<float> rows(order.begin(), order.end());
    for (int64_t first = 0; first < batches; first += H) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      int64_t examples = 0;
      for (int r = 0; r < workers; ++r) {
        std::vector<float> w = outer;
        int64_t covered = 0;
        for (int64_t b = first; b < std::min(batches, first + H); ++b) {
          const ShardRange shard = ShardOf(data.count, batch, b, r, workers);
          EXPECT_TRUE((*model)->SetWeights(w.data()).ok());
          EXPECT_TRUE((*model)
                          ->ComputeGradients(Examples::Resident(data.images.data(), labels.data(),
                                                                rows.data() + shard.begin),
                                             static_cast<int>(shard.size()))
                          .ok());
          EXPECT_TRUE((*model)->GetGradients(grad.data()).ok());
          if (shard.size() > 0) {
            auto slots = spans(inner_slots[r]);
            (*inner_opt)->Apply(inner_updates[r], (*inner_opt)->LearningRate(inner_updates[r]), absl::MakeSpan(w),
                                slots, grad, shard.size());
            ++inner_updates[r];
          }
          covered += shard.size();
        }
        for (int64_t i = 0; i < params; ++i) sum[i] += static_cast<float>(covered) * (outer[i] - w[i]);
        examples += covered;
      }
      auto slots = spans(outer_slots);
      (*outer_opt)->Apply(t, (*outer_opt)->LearningRate(t), absl::MakeSpan(outer), slots, sum, examples);
      ++t;
    }
  }
  return outer;
}

std::vector<float> LeNetInitial() { return LeNet::SeedWeights(kSeed); }

int Differing(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] != b[i];
  return n;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

TEST(DilocoTest, OneLocalStepWithOuterSgdAtRateOneIsTheSyncJob) {
  // One worker, batches of 64 (a power of two: the pseudo-gradient's scaling by its examples
  // and the server's division by them are exact), 4 batches an epoch. Each exchange: the worker
  // steps w - lr*g, pushes 64*(w - w'), and the server steps w by exactly that: the sync job's
  // update, computed on the other side of the wire.
  const Dataset data = SyntheticDataset(256, 5);
  const JobRun sync = Train(Job(1, server::Mode::kSync, 0, Sgd(0.2)), 1, 64, data, 2, {});
  const JobRun diloco = Train(Job(1, server::Mode::kSync, 1, Sgd(1.0)), 1, 64, data, 2, Sgd(0.2));
  ASSERT_FALSE(sync.server_weights.empty());
  EXPECT_GT(MaxAbsDiff(sync.server_weights, LeNetInitial()), 1e-3) << "training must move the weights";
  EXPECT_EQ(sync.version, 8u);
  EXPECT_EQ(diloco.version, 8u) << "one exchange per batch";
  EXPECT_EQ(Differing(diloco.server_weights, sync.server_weights), 0);
  EXPECT_EQ(diloco.worker_weights[0], diloco.server_weights);
}

TEST(DilocoTest, TwoWorkersOneLocalStepFollowTheSyncJob) {
  // Two workers: each steps on its half of the batch, so the average of their steps is the sync
  // step up to float rounding (w - (w - lr*g) is not lr*g to the last bit).
  const Dataset data = SyntheticDataset(256, 5);
  const JobRun sync = Train(Job(2, server::Mode::kSync, 0, Sgd(0.2)), 2, 64, data, 2, {});
  const JobRun diloco = Train(Job(2, server::Mode::kSync, 1, Sgd(1.0)), 2, 64, data, 2, Sgd(0.2));
  ASSERT_FALSE(diloco.server_weights.empty());
  EXPECT_LT(MaxAbsDiff(diloco.server_weights, sync.server_weights), 1e-5);
  for (const auto& w : diloco.worker_weights) EXPECT_EQ(w, diloco.server_weights);
}

TEST(DilocoTest, TwoWorkersTenLocalStepsAreAReplayOfTheAlgorithm) {
  // 32 batches of 51 an epoch (the last of 19): exchanges of 10, 10, 10 and 2 local steps; two
  // epochs, so the inner Adam's state runs across exchanges and epochs. The shards are uneven
  // (25 and 26 examples, 9 and 10 in the last batch), so the ranks' pseudo-gradients weigh
  // differently in the average. The outer optimizer is the paper's.
  const Dataset data = SyntheticDataset(1600, 7);
  const OptimizerOptions outer = Sgd(0.7, 0.9, /*nesterov=*/true);
  const JobRun run = Train(Job(2, server::Mode::kSync, 10, outer), 2, 51, data, 2, Adam(1e-3));
  ASSERT_FALSE(run.server_weights.empty());
  EXPECT_EQ(run.version, 8u) << "4 exchanges an epoch";
  const std::vector<float> replay = Replay(2, 51, data, 2, 10, Adam(1e-3), outer);
  EXPECT_GT(MaxAbsDiff(replay, LeNetInitial()), 1e-3) << "training must move the weights";
  EXPECT_EQ(Differing(run.server_weights, replay), 0) << "max diff " << MaxAbsDiff(run.server_weights, replay);
  for (const auto& w : run.worker_weights) EXPECT_EQ(w, run.server_weights);
}

TEST(DilocoTest, AsyncWithOneWorkerIsTheReplay) {
  // Async DiLoCo applies each pseudo-gradient as it comes, as its share of the group's: with one
  // worker, the whole, and the job is the algorithm's replay.
  const Dataset data = SyntheticDataset(640, 3);
  const OptimizerOptions outer = Sgd(0.7, 0.9, /*nesterov=*/true);
  const JobRun run = Train(Job(1, server::Mode::kAsync, 4, outer), 1, 64, data, 1, Sgd(0.1));
  ASSERT_FALSE(run.server_weights.empty());
  EXPECT_EQ(run.version, 3u) << "exchanges of 4, 4 and 2 batches";
  EXPECT_EQ(Differing(run.server_weights, Replay(1, 64, data, 1, 4, Sgd(0.1), outer)), 0);
}

// The server's side alone, on a model of 6 floats (tests/parameter_server_fixtures.h): how
// pseudo-gradients are weighted.
class DilocoServerTest : public server::ParameterServerTest {
 protected:
  server::JoinRequestView DilocoJoin(int rank, bool with_values) {
    server::JoinRequestView v = JoinView(rank, with_values);
    v.takes_local_steps = true;
    return v;
  }

  static server::ServerOptions DilocoOptions(server::Mode mode) {
    server::ServerOptions o = Options();  // 2 workers, outer SGD at rate 1, partitions of 4 and 2
    o.mode = mode;
    o.sync_every = 5;
    return o;
  }
};

TEST_F(DilocoServerTest, SyncAveragesPseudoGradientsWeightedByExamples) {
  server::ParameterServer ps(DilocoOptions(server::Mode::kSync));
  ASSERT_TRUE(ps.Join(DilocoJoin(0, true)).ok());
  ASSERT_TRUE(ps.Join(DilocoJoin(1, false)).ok());
  // Rank 0 covered 8 examples and moved by {1, 1, 1, 1}; rank 1 covered 24 and moved by
  // {3, 3, 3, 3}: the average is (8*1 + 24*3) / 32 = 2.5.
  ASSERT_TRUE(ps.Push(PushView(0, 0, 0, server::Bytes({8, 8, 8, 8}), 8)).ok());
  ASSERT_TRUE(ps.Push(PushView(1, 0, 0, server::Bytes({72, 72, 72, 72}), 24)).ok());
  EXPECT_EQ(server::Weights(ps), (std::vector<float>{-1.5f, -0.5f, 0.5f, 1.5f, 10, 20}));
}

TEST_F(DilocoServerTest, AJoinerThatTakesNoLocalStepsIsRefused) {
  // Its pushes would be gradients (an older worker, a synthetic one, the Python
  // ParameterServerOptimizer), which a DiLoCo job takes as pseudo-gradients.
  server::ParameterServer ps(DilocoOptions(server::Mode::kSync));
  absl::StatusOr<server::JoinResult> refused = ps.Join(JoinView(0, true));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("does not take local steps"), std::string::npos) << refused.status();
  EXPECT_TRUE(ps.Join(DilocoJoin(0, true)).ok());
}

TEST_F(DilocoServerTest, AsyncTakesEachPseudoGradientAsItsShareOfTheGroup) {
  server::ParameterServer ps(DilocoOptions(server::Mode::kAsync));
  ASSERT_TRUE(ps.Join(DilocoJoin(0, true)).ok());
  ASSERT_TRUE(ps.Join(DilocoJoin(1, false)).ok());
  // Rank 0's pseudo-gradient {2, 2, 2, 2} over 8 examples, applied alone: half of it (one of
  // two members), not the whole as an async gradient would be.
  ASSERT_TRUE(ps.Push(PushView(0, 0, 0, server::Bytes({16, 16, 16, 16}), 8)).ok());
  EXPECT_EQ(server::Weights(ps), (std::vector<float>{0, 1, 2, 3, 10, 20}));
  ASSERT_TRUE(ps.Push(PushView(1, 0, 0, server::Bytes({16, 16, 16, 16}), 8)).ok());
  EXPECT_EQ(server::Weights(ps), (std::vector<float>{-1, 0, 1, 2, 10, 20}));
}

TEST(DilocoCheckpointTest, ARestoreRefusesAnotherH) {
  // A worker's place in the data is the version times H: a checkpoint of H = 10 restored into a
  // job of H = 50 (or of gradients) would skip or repeat examples.
  server::JobDescription ours;
  ours.world_size = 2;
  ours.partition_bytes = 16;
  ours.optimizer_name = "sgd";
  ours.slot_names = {"momentum_buffer"};
  ours.sync_every = 50;
  server::JobDescription theirs = ours;
  theirs.sync_every = 10;
  const summa::v1::Checkpoint header = server::EncodeCheckpointHeader(theirs, {{"w", DType::kFloat32, {2, 2}}}, 3, absl::Now());
  absl::StatusOr<server::CheckpointHeader> decoded = server::DecodeCheckpointHeader(header, ours);
  EXPECT_TRUE(absl::IsFailedPrecondition(decoded.status())) << decoded.status();
  EXPECT_NE(decoded.status().message().find("every 10 local steps"), std::string::npos) << decoded.status();
  ours.sync_every = 0;
  EXPECT_TRUE(absl::IsFailedPrecondition(server::DecodeCheckpointHeader(header, ours).status()));
  ours.sync_every = 10;
  const absl::Status same = server::DecodeCheckpointHeader(header, ours).status();
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace summa::worker
