// The seed's promise across processes: N workers with shards of a global batch B follow the same
// trajectory as one worker with batch B. Runs an in-process server on 127.0.0.1:0 and N trainers
// as threads, each with its own backend and client, on a small synthetic data set.
#include <cmath>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/in_process_job.h"
#include "tests/synthetic_dataset.h"
#include "server/daemon.h"
#include "worker/models/lenet.h"
#include "client/ps_client.h"
#include "worker/trainer.h"

namespace summa::worker {
namespace {

using JobRun = InProcessRun;

JobRun Train(int workers, int64_t batch, const Dataset& data, int epochs, int devices = 1,
             int64_t partition_bytes = 4 << 20) {
  server::ServerOptions so;
  so.world_size = workers;
  so.optimizer.learning_rate = 0.2;
  so.barrier_deadline = absl::Seconds(60);
  so.partition_bytes = partition_bytes;
  return RunInProcess(so, data, devices, [&](TrainerOptions& o, ParameterClient&) {
    o.batch_size = batch;
    o.epochs = epochs;
    o.seed = 11;
  });
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

class EquivalenceTest : public ::testing::Test {
 protected:
  // 230 examples in batches of 50: four full batches and a short one of 30, per epoch.
  const Dataset data_ = SyntheticDataset(230, 5);
};

TEST_F(EquivalenceTest, TwoWorkersMatchOneWorkerWithTheWholeBatch) {
  const JobRun one = Train(1, 50, data_, 2);
  const JobRun two = Train(2, 50, data_, 2);
  const std::vector<float> initial = LeNet::SeedWeights(11);
  EXPECT_GT(MaxAbsDiff(one.server_weights, initial), 1e-3) << "training must move the weights";
  EXPECT_LT(MaxAbsDiff(one.server_weights, two.server_weights), 2e-5);
  for (const auto& w : two.worker_weights) EXPECT_EQ(w, two.server_weights);
  ASSERT_EQ(one.losses.size(), 2u);
  ASSERT_EQ(two.losses.size(), 2u);
  EXPECT_NEAR(one.losses[1], two.losses[1], 1e-4);
  EXPECT_LT(one.losses[1], one.losses[0]) << "loss falls on learnable data";
}

TEST_F(EquivalenceTest, TwoWorkersInManyPartitionsMatchOneWorkerInOne) {
  // 4 KiB partitions: LeNet's 129068 parameters travel in 127 pieces, so every worker-side offset
  // into the flat buffers is exercised; the server's update is elementwise, so the result is the
  // same bits as one partition's.
  const JobRun one = Train(1, 50, data_, 2);
  const JobRun two = Train(2, 50, data_, 2, /*devices=*/1, /*partition_bytes=*/4096);
  EXPECT_LT(MaxAbsDiff(one.server_weights, two.server_weights), 2e-5);
  for (const auto& w : two.worker_weights) EXPECT_EQ(w, two.server_weights);
  const JobRun two_whole = Train(2, 50, data_, 2);
  EXPECT_EQ(two.server_weights, two_whole.server_weights);
}

TEST_F(EquivalenceTest, ThreeWorkersWithUnevenShardsMatchOneWorker) {
  // Batches of 50 split 16/17/17, the short last batch of 30 split 10/10/10.
  const JobRun one = Train(1, 50, data_, 2);
  const JobRun three = Train(3, 50, data_, 2);
  EXPECT_LT(MaxAbsDiff(one.server_weights, three.server_weights), 2e-5);
  for (const auto& w : three.worker_weights) EXPECT_EQ(w, three.server_weights);
}

TEST_F(EquivalenceTest, OneWorkerOnTwoLocalDevicesMatchesOneDevice) {
  // The seed's single-process method: the shard split across devices, gradients summed on the
  // first device (here two CPU backends, through the same CopyFromPeer + Axpy path as GPUs).
  const JobRun one = Train(1, 50, data_, 2);
  const JobRun split = Train(1, 50, data_, 2, /*devices=*/2);
  EXPECT_LT(MaxAbsDiff(one.server_weights, split.server_weights), 2e-5);
  EXPECT_GT(MaxAbsDiff(split.server_weights, LeNet::SeedWeights(11)), 1e-3);
}

}  // namespace
}  // namespace summa::worker
