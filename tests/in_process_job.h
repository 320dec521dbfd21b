// A training job in one process, for tests that hold trainers to a trajectory: an in-process
// summa-server on 127.0.0.1:0 and one Trainer per rank as threads, each with its own CPU
// backends and client, evaluation off. Returns what the tests compare: the server's weights at
// the end, each rank's, rank 0's per-epoch losses and the server's version.
#ifndef SUMMA_TESTS_IN_PROCESS_JOB_H_
#define SUMMA_TESTS_IN_PROCESS_JOB_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/parameter_server_peer.h"
#include "worker/trainer.h"

namespace summa::worker {

struct InProcessRun {
  std::vector<float> server_weights;  // empty when the server did not start
  std::vector<std::vector<float>> worker_weights;
  std::vector<double> losses;  // rank 0's per-epoch loss
  uint64_t version = 0;
};

// `so.world_size` ranks, each with `devices` CPU backends, its TrainerOptions (rank, world size)
// set and then adjusted by `configure` with its client (may be null). Trainer failures fail the
// test.
inline InProcessRun RunInProcess(const server::ServerOptions& so, const Dataset& data, int devices,
                                 const std::function<void(TrainerOptions&, ParameterClient&)>& configure) {
  InProcessRun run;
  auto server = server::SummaServer::Start("127.0.0.1:0", so);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return run;
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  const int workers = so.world_size;
  run.worker_weights.resize(workers);
  std::vector<std::thread> threads;
  std::FILE* sink = std::fopen("/dev/null", "w");
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<std::unique_ptr<Backend>> backends;
      std::vector<Backend*> raw;
      for (int d = 0; d < devices; ++d) {
        backends.push_back(NewCpuBackend(1));
        raw.push_back(backends.back().get());
      }
      ParameterClient client(address, absl::Seconds(60), absl::Seconds(30));
      StatusBoard board;
      TrainerOptions o;
      o.rank = rank;
      o.world_size = workers;
      o.evaluate = false;
      if (configure) configure(o, client);
      Trainer trainer(o, &data, nullptr, raw, &client, &board, sink);
      absl::Status s = trainer.Run();
      ASSERT_TRUE(s.ok()) << "rank " << rank << ": " << s;
      run.worker_weights[rank] = trainer.weights();
      if (rank == 0) {
        for (const EpochResult& r : trainer.results()) run.losses.push_back(r.loss);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::fclose(sink);
  run.server_weights = server::ParameterServerPeer::Weights((*server)->core());
  run.version = (*server)->core().version();
  return run;
}

}  // namespace summa::worker

#endif  // SUMMA_TESTS_IN_PROCESS_JOB_H_
