// Trainer with --overlap against a summa-server in this process: two workers, each a Trainer on a
// thread of its own with its own ParameterClient, train LeNet and the MLP cut into partitions of
// 64 KiB (8 and 13 of them, several straddling two layers) in sync mode, in uneven batches that
// the CPU computes in chunks. Overlapped or not, they end with the same weights, bit for bit.
// And LayerExchange (worker/layer_exchange.h) alone: when each partition goes.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server_fixture.h"
#include "worker/compute/backend.h"
#include "worker/layer_exchange.h"
#include "worker/models/lenet.h"
#include "worker/models/model.h"
#include "worker/status_board.h"
#include "worker/trainer.h"

namespace summa::worker {
namespace {

// 100 examples of 28x28 in global batches of 40: steps of 40, 40 and 20, each worker's shard
// computed in chunks of 16 (the CPU's).
Dataset Data() {
  Dataset d;
  d.count = 100;
  d.rows = d.cols = 28;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> pixel(0, 1);
  d.images.resize(d.count * 28 * 28);
  for (float& p : d.images) p = pixel(rng);
  for (int i = 0; i < d.count; ++i) d.labels.push_back(static_cast<int32_t>(rng() % 10));
  return d;
}

// The bits of each float: equal vectors are equal bit for bit (and NaN compares as itself).
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

class TrainerOverlapTest : public ServerFixture {
 protected:
  // One LeNet step through LayerExchange on a job with this wire format, in partitions of 16384
  // floats: when each partition became ready and went (the test below says what is expected).
  void EachPartitionGoesAsTheLastOfItsLayersFinishes(WireDType wire);

  struct Worker {
    absl::Status status;
    std::vector<float> weights;
    std::string output;
  };

  // A job of two workers on a fresh server (the job's wire format `wire`); each worker's outcome.
  std::vector<Worker> Train(const std::string& model, bool overlap, WireDType wire = WireDType::kFloat32) {
    configure_ = [wire](server::ServerOptions& o) {
      o.optimizer.learning_rate = 0.05;
      o.wire_dtype = wire;
    };
    StartServer(2, 65536);
    const Dataset data = Data();
    std::vector<Worker> workers(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        std::unique_ptr<ParameterClient> client = Client(1);
        std::unique_ptr<Backend> backend = NewCpuBackend(1);
        TrainerOptions o;
        o.rank = rank;
        o.world_size = 2;
        o.batch_size = 40;
        o.epochs = 2;
        o.model = model;
        o.seed = 3;
        o.evaluate = false;
        o.overlap = overlap;
        StatusBoard board;
        std::FILE* out = std::tmpfile();
        Trainer trainer(o, &data, nullptr, {backend.get()}, client.get(), &board, out);
        workers[rank].status = trainer.Run();
        workers[rank].weights = trainer.weights();
        std::rewind(out);
        char line[512];
        while (std::fgets(line, sizeof(line), out) != nullptr) workers[rank].output += line;
        std::fclose(out);
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(Status().version(), 6u);
    server_.reset();
    return workers;
  }
};

TEST_F(TrainerOverlapTest, OverlappedStepsGiveTheBlockingStepsWeightsBitForBit) {
  for (const std::string model : {"lenet", "mlp"}) {
    SCOPED_TRACE(model);
    const std::vector<Worker> blocking = Train(model, /*overlap=*/false);
    const std::vector<Worker> overlapped = Train(model, /*overlap=*/true);
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      ASSERT_TRUE(blocking[rank].status.ok()) << blocking[rank].status << blocking[rank].output;
      ASSERT_TRUE(overlapped[rank].status.ok()) << overlapped[rank].status << overlapped[rank].output;
      EXPECT_NE(blocking[rank].output.find(absl::StrCat("(model ", model, ", sync mode)")), std::string::npos)
          << blocking[rank].output;
      EXPECT_NE(overlapped[rank].output.find(absl::StrCat("(model ", model, ", sync mode, overlapped)")),
                std::string::npos)
          << overlapped[rank].output;
      ASSERT_FALSE(blocking[rank].weights.empty());
      EXPECT_TRUE(Bits(overlapped[rank].weights) == Bits(blocking[rank].weights))
          << "the overlapped run's weights differ from the blocking run's";
      EXPECT_TRUE(Bits(overlapped[rank].weights) == Bits(overlapped[0].weights)) << "the workers disagree";
    }
    std::unique_ptr<Backend> backend = NewCpuBackend(1);
    const std::vector<float> initial = (*NewModel(model, backend.get(), 1))->InitialWeights(3);
    EXPECT_TRUE(Bits(blocking[0].weights) != Bits(initial)) << "the job trained nothing";
  }
}

// A 16-bit wire is encoded partition by partition as each is ready, so it overlaps too, and its
// steps are the blocking steps' (each partition's values rounded to bf16 the same way).
TEST_F(TrainerOverlapTest, ASixteenBitWireOverlapsAndGivesTheBlockingStepsWeightsBitForBit) {
  const std::vector<Worker> blocking = Train("lenet", /*overlap=*/false, WireDType::kBfloat16);
  const std::vector<Worker> overlapped = Train("lenet", /*overlap=*/true, WireDType::kBfloat16);
  const std::vector<Worker> float32 = Train("lenet", /*overlap=*/false);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_TRUE(blocking[rank].status.ok()) << blocking[rank].status << blocking[rank].output;
    ASSERT_TRUE(overlapped[rank].status.ok()) << overlapped[rank].status << overlapped[rank].output;
    EXPECT_NE(overlapped[rank].output.find("(model lenet, sync mode, bf16 on the wire, overlapped)"), std::string::npos)
        << overlapped[rank].output;
    ASSERT_FALSE(blocking[rank].weights.empty());
    EXPECT_TRUE(Bits(overlapped[rank].weights) == Bits(blocking[rank].weights))
        << "the overlapped run's weights differ from the blocking run's";
  }
  EXPECT_TRUE(Bits(blocking[0].weights) != Bits(float32[0].weights)) << "the wire was not bf16";
}

// LeNet's layers are {W1 b1} [0, 200), {W2 b2} [200, 25250), {W3 b3} [25250, 127778) and {W4 b4}
// [127778, 129068); partitions of 16384 floats: 0 holds conv1 and the start of conv2, 1 the rest
// of conv2 and the start of linear3, 2..6 linear3, 7 its end and linear4. Backward goes linear4
// (nothing complete), linear3 (2..7 go), conv2 (1), conv1 (0): each partition goes as the last of
// its layers finishes, not at the end; with a float32 wire and with a 16-bit one (that each
// partition's push then goes at once, not after the last, ps_client_test's
// AStagedStepOnASixteenBitWireSendsEachPartitionAsItIsStarted shows without timing).
TEST_F(TrainerOverlapTest, EachPartitionGoesAsTheLastOfItsLayersFinishes) {
  for (const WireDType wire : {WireDType::kFloat32, WireDType::kBfloat16}) {
    SCOPED_TRACE(WireDTypeName(wire));
    EachPartitionGoesAsTheLastOfItsLayersFinishes(wire);
    server_.reset();
  }
}

void TrainerOverlapTest::EachPartitionGoesAsTheLastOfItsLayersFinishes(WireDType wire) {
  configure_ = [wire](server::ServerOptions& o) { o.wire_dtype = wire; };
  StartServer(1, 65536);
  std::unique_ptr<ParameterClient> client = Client(1);
  std::unique_ptr<Backend> backend = NewCpuBackend(1);
  auto model = NewModel("lenet", backend.get(), 20, 16);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> initial = (*model)->InitialWeights(3);
  auto joined = client->Join(0, 1, LeNet::Specs(), initial.data(), "");
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(client->partitions().size(), 8u);
  auto weights = backend->AllocHost(LeNet::NumParams());
  auto gradients = backend->AllocHost(LeNet::NumParams());
  ASSERT_TRUE(weights.ok() && gradients.ok());
  ASSERT_TRUE(client->PullAll(0, (*weights)->data()).ok());
  ASSERT_TRUE((*model)->SetWeights((*weights)->data()).ok());
  LayerExchange exchange(client.get(), model->get(), backend.get(), (*weights)->data(), (*gradients)->data(), nullptr);
  ASSERT_TRUE(exchange.Plan().ok());
  const Dataset data = Data();
  std::vector<float> labels(data.labels.begin(), data.labels.end());
  exchange.BeginCompute(0, 20);
  ASSERT_TRUE((*model)->ComputeGradientsPerLayer(Examples::Host(data.images.data(), labels.data()), 20, exchange).ok());
  ASSERT_TRUE(exchange.EndCompute().ok());
  std::vector<int> live;
  ASSERT_TRUE(exchange.Settle(&live).ok());
  EXPECT_EQ(live, std::vector<int>{0});
  EXPECT_EQ(exchange.steps_finished(), 1u);
  const std::vector<StepExchange::Times> times = exchange.timeline();
  ASSERT_EQ(times.size(), 8u);
  for (size_t p = 2; p < 8; ++p) EXPECT_LT(times[p].ready_ns, times[1].ready_ns) << "partition " << p;
  EXPECT_LT(times[1].ready_ns, times[0].ready_ns);
  for (size_t p = 0; p < 8; ++p) EXPECT_GE(times[p].end_ns, times[p].start_ns) << "partition " << p;
  // The gradients pushed are the model's, and the weights pulled are in the model.
  std::vector<float> pushed((*gradients)->data(), (*gradients)->data() + LeNet::NumParams());
  std::vector<float> computed(LeNet::NumParams());
  ASSERT_TRUE((*model)->GetGradients(computed.data()).ok());
  EXPECT_TRUE(Bits(pushed) == Bits(computed));
  std::vector<float> pulled(LeNet::NumParams());
  ASSERT_TRUE(client->PullAll(1, pulled.data()).ok());
  std::vector<float> loaded(LeNet::NumParams());
  ASSERT_TRUE(backend->Download((*model)->weights()->data(), LeNet::NumParams(), loaded.data()).ok());
  EXPECT_TRUE(Bits(loaded) == Bits(pulled));
  EXPECT_TRUE(Bits(loaded) != Bits(initial));
}

}  // namespace
}  // namespace summa::worker
