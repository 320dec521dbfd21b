// The synthetic worker (worker/synthetic.h): the model every worker describes alike, the examples
// that make the server's scale exact, its result line, its flag checks, and whole runs against a
// real server on 127.0.0.1:0 that must end on the exact expected weights.
#include "worker/synthetic.h"

#include <cstdio>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/daemon.h"
#include "client/ps_client.h"

namespace summa::worker {
namespace {

TEST(SyntheticTest, ModelIsTheSameTensorsForEverySize) {
  const std::vector<TensorSpec> small = SyntheticSpecs(1 << 20);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].name, "synthetic.0");
  EXPECT_EQ(small[0].shape, std::vector<int64_t>{1 << 18});
  // 1 GiB: four tensors of 256 MiB; a size that is not a whole number of tensors ends short.
  const std::vector<TensorSpec> big = SyntheticSpecs(int64_t{1} << 30);
  ASSERT_EQ(big.size(), 4u);
  EXPECT_EQ(big[3].name, "synthetic.3");
  EXPECT_EQ(big[3].shape, std::vector<int64_t>{kSyntheticTensorFloats});
  const std::vector<TensorSpec> odd = SyntheticSpecs(kSyntheticTensorFloats * 4 + 12);
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[1].shape, std::vector<int64_t>{3});
  EXPECT_EQ(SyntheticSpecs(1 << 20), small);  // deterministic
}

TEST(SyntheticTest, ExamplesPerStepAddUpToAPowerOfTwo) {
  for (int world = 1; world <= 40; ++world) {
    int64_t total = 0;
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_GE(SyntheticExamples(rank, world), 1);
      total += SyntheticExamples(rank, world);
    }
    EXPECT_EQ(total & (total - 1), 0) << world << " workers push " << total << " examples";
    EXPECT_GE(total, world);
    EXPECT_LT(total, 2 * world);
  }
  // 1 example each whenever the world is a power of two: the mean gradient is (N+1)/2.
  EXPECT_DOUBLE_EQ(SyntheticShift(4, 20, 1.0 / 1024), 20.0 / 1024 * 2.5);
  EXPECT_DOUBLE_EQ(SyntheticShift(3, 1, 1.0), 6.0 / 4);
}

TEST(SyntheticTest, ResultLineRoundTrips) {
  SyntheticResult r;
  r.rank = 3;
  r.world = 4;
  r.params = 262144;
  r.steps = 3;
  r.median_step_us = 812.5;
  r.push_bytes_per_step = r.pull_bytes_per_step = 1 << 20;
  r.first_weight = -0.0029296875f;
  r.uniform = true;
  r.step_us = {900.1, 812.5, 790};
  auto parsed = ParseSyntheticResult("synthetic_step rank=3 step=0 us=900.1\n" + FormatSyntheticResult(r) + "\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rank, 3);
  EXPECT_EQ(parsed->world, 4);
  EXPECT_EQ(parsed->params, 262144);
  EXPECT_EQ(parsed->steps, 3);
  EXPECT_EQ(parsed->push_bytes_per_step, 1 << 20);
  EXPECT_EQ(parsed->first_weight, r.first_weight);
  EXPECT_TRUE(parsed->uniform);
  EXPECT_EQ(parsed->step_us, r.step_us);
  // A float that needs all nine digits comes back bit for bit.
  r.first_weight = 0.1f + 1e-8f;
  EXPECT_EQ(ParseSyntheticResult(FormatSyntheticResult(r))->first_weight, r.first_weight);

  EXPECT_EQ(ParseSyntheticResult("nothing here\n").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseSyntheticResult("synthetic_result rank=0 world=1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSyntheticResult("synthetic_result rank=0 world=1 params=1 steps=2 median_step_us=1 "
                                 "push_bytes_per_step=4 pull_bytes_per_step=4 first_weight=x "
                                 "uniform=yes step_us=1,2")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSyntheticResult("synthetic_result rank=0 world=1 params=1 steps=3 median_step_us=1 "
                                 "push_bytes_per_step=4 pull_bytes_per_step=4 first_weight=1 "
                                 "uniform=yes step_us=1,2")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticTest, BadOptionsNameTheirFlag) {
  SyntheticOptions o;
  o.model_bytes = 1 << 20;
  o.world_size = 2;
  o.rank = 1;
  EXPECT_TRUE(ValidateSyntheticOptions(o).ok());
  auto message = [](SyntheticOptions bad) { return std::string(ValidateSyntheticOptions(bad).message()); };
  SyntheticOptions bad = o;
  bad.model_bytes = 6;
  EXPECT_NE(message(bad).find("--synthetic"), std::string::npos) << message(bad);
  bad.model_bytes = int64_t{1} << 60;  // more than this machine's memory
  EXPECT_NE(message(bad).find("memory"), std::string::npos) << message(bad);
  bad = o;
  bad.steps = 0;
  EXPECT_NE(message(bad).find("--steps"), std::string::npos);
  bad = o;
  bad.rank = 2;
  EXPECT_NE(message(bad).find("--rank"), std::string::npos);
  bad = o;
  bad.world_size = 0;
  EXPECT_NE(message(bad).find("--world_size"), std::string::npos);
}

// `world` synthetic workers as threads, each with its own client, against one real server.
std::vector<absl::StatusOr<SyntheticResult>> RunJob(int world, int64_t model_bytes, int64_t steps,
                                                    int64_t partition_bytes, double lr) {
  server::ServerOptions so;
  so.world_size = world;
  so.optimizer.learning_rate = lr;
  so.partition_bytes = partition_bytes;
  so.barrier_deadline = absl::Seconds(30);
  auto server = server::SummaServer::Start("127.0.0.1:0", so);
  EXPECT_TRUE(server.ok()) << server.status();
  std::vector<absl::StatusOr<SyntheticResult>> results(world, absl::UnknownError("not run"));
  if (!server.ok()) return results;
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      SyntheticOptions o;
      o.model_bytes = model_bytes;
      o.steps = steps;
      o.rank = rank;
      o.world_size = world;
      ParameterClient client(address, absl::Seconds(30), absl::Seconds(30));
      std::FILE* sink = std::tmpfile();
      results[rank] = RunSynthetic(o, &client, sink);
      std::fclose(sink);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(SyntheticTest, WorkersEndOnTheExactWeights) {
  // 3 workers (4 examples a step in all) over a model of 3 partitions, 4 steps.
  constexpr int kWorld = 3;
  constexpr int64_t kBytes = 1 << 16;
  constexpr double kLr = 1.0 / 1024;
  const auto results = RunJob(kWorld, kBytes, 4, /*partition_bytes=*/kBytes / 3 + 4, kLr);
  const float expected = static_cast<float>(SyntheticInitialValue(0) - SyntheticShift(kWorld, 4, kLr));
  ASSERT_EQ(expected, -4.0f / 1024 * 6 / 4);
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << results[rank].status();
    const SyntheticResult& r = *results[rank];
    EXPECT_EQ(r.rank, rank);
    EXPECT_EQ(r.params, kBytes / 4);
    EXPECT_EQ(r.push_bytes_per_step, kBytes);
    EXPECT_EQ(r.step_us.size(), 4u);
    EXPECT_EQ(r.first_weight, expected) << "rank " << rank;
    EXPECT_TRUE(r.uniform) << "rank " << rank;
  }
}

TEST(SyntheticTest, OneWorkerOverFourPartitions) {
  const auto results = RunJob(1, /*model_bytes=*/4 << 20, 2, /*partition_bytes=*/1 << 20, 0.5);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[0]->first_weight, -1.0f);  // 2 steps x 0.5 x gradient 1
  EXPECT_TRUE(results[0]->uniform);
}

}  // namespace
}  // namespace summa::worker
