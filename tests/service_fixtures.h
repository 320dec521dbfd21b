// What the service tests share (service_test.cc, service_limits_test.cc, coordination_test.cc):
// floats as bytes and back, a poll with a deadline, and ServiceTest, the daemon in-process on
// 127.0.0.1:0 with typed stubs of it.
#ifndef SUMMA_TESTS_SERVICE_FIXTURES_H_
#define SUMMA_TESTS_SERVICE_FIXTURES_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {

namespace pb = ::summa::v1;

inline std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
inline std::vector<float> Floats(const std::string& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Waits (up to 20 s, polling) for `done`; false if it never held.
inline bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

class ServiceTest : public ::testing::Test {
 protected:
  void StartServer(int workers, int64_t partition_bytes = 4 << 20, LimitOptions limits = {},
                   const Clock* clock = Clock::Real()) {
    ServerOptions o;
    o.world_size = workers;
    o.limits = limits;
    o.clock = clock;
    o.optimizer.learning_rate = 0.5;
    o.partition_bytes = partition_bytes;
    o.barrier_deadline = absl::Seconds(20);
    o.require_sessions = false;  // these typed stubs speak the first release's messages
    if (configure_) configure_(o);
    auto s = SummaServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  std::unique_ptr<pb::ParameterServer::Stub> Stub() {
    return pb::ParameterServer::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }
  static void Deadline(grpc::ClientContext& ctx, int seconds = 20) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }
  pb::JoinRequest JoinMsg(int rank, int world, bool values) {
    pb::JoinRequest j;
    j.set_rank(rank);
    j.set_world_size(world);
    pb::Tensor* t = j.add_params();
    t->set_name("w");
    t->set_dtype(pb::DTYPE_FLOAT32);
    t->add_shape(8);
    if (values) t->set_data(Bytes({0, 0, 0, 0, 0, 0, 0, 0}));
    return j;
  }

  // Ranks 0 (with the initial values) and 1 join a job of two.
  void JoinTwo(pb::ParameterServer::Stub& stub) {
    for (int rank : {0, 1}) {
      grpc::ClientContext ctx;
      Deadline(ctx);
      pb::JoinResponse joined;
      ASSERT_TRUE(stub.Join(&ctx, JoinMsg(rank, 2, rank == 0), &joined).ok());
    }
  }
  std::unique_ptr<SummaServer> server_;
  std::function<void(ServerOptions&)> configure_;  // applied last by StartServer, when set
};

}  // namespace summa::server

#endif  // SUMMA_TESTS_SERVICE_FIXTURES_H_
