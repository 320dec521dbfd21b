// What the tests of the core's ParameterServer share (parameter_server_test.cc and the
// parameter_server_*_test.cc beside it): the server's weights and floats as bytes, and the two
// small jobs most of them run.
#ifndef SUMMA_TESTS_PARAMETER_SERVER_FIXTURES_H_
#define SUMMA_TESTS_PARAMETER_SERVER_FIXTURES_H_

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/parameter_server.h"
#include "tests/parameter_server_peer.h"

namespace summa::server {

// The server's whole flat weights (tests/parameter_server_peer.h).
inline std::vector<float> Weights(const ParameterServer& ps) { return ParameterServerPeer::Weights(ps); }

inline std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Both ranks' gradients of `step` for each partition in `held` (a shard's, as its joins listed
// them): each element's value depends on the step, the rank and its place in the model alone, so
// that any shard count computes the same sums.
inline void PushBothRanks(ParameterServer& server, const std::vector<PartitionRange>& held, uint64_t step) {
  for (const PartitionRange& r : held) {
    for (int rank : {0, 1}) {
      std::vector<float> g(r.length);
      for (int64_t k = 0; k < r.length; ++k) {
        g[k] = std::sin(0.37f * static_cast<float>((step + 1) * (rank + 2)) + 0.11f * static_cast<float>(r.offset + k));
      }
      const std::string bytes = Bytes(g);
      PushRequestView v;
      v.rank = rank;
      v.step = step;
      v.partition = r.id;
      v.num_examples = 1 + rank;
      v.data = bytes;
      absl::StatusOr<bool> pushed = server.Push(v);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
    }
  }
}

inline std::string Floats4(float v) {
  const std::vector<float> f(4, v);
  return std::string(reinterpret_cast<const char*>(f.data()), 16);
}

// Two tensors, 6 floats in all, cut into partitions of 4 and 2 floats.
class ParameterServerTest : public ::testing::Test {
 protected:
  ParameterServerTest() : ps_(Options()) {}

  static ServerOptions Options() {
      ServerOptions o;
    o.require_sessions = false;  // these cases are about other things; sessions: SessionTest
    o.world_size = 2;
    o.optimizer.learning_rate = 1.0;
    o.partition_bytes = 16;
    o.barrier_deadline = absl::Seconds(30);
    return o;
  }

  JoinRequestView JoinView(int rank, bool with_values) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, {2, 2}}, with_values ? absl::string_view(w_) : absl::string_view()},
                {{"b", DType::kFloat32, {2}}, with_values ? absl::string_view(b_) : absl::string_view()}};
    return v;
  }

  void JoinBoth() {
    ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
    ASSERT_TRUE(ps_.Join(JoinView(1, false)).ok());
  }

  PushRequestView PushView(int rank, uint64_t step, uint32_t partition, const std::string& data,
                           int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.partition = partition;
    v.num_examples = examples;
    v.data = data;
    return v;
  }

  const std::string w_ = Bytes({1, 2, 3, 4});
  const std::string b_ = Bytes({10, 20});
  ParameterServer ps_;
};

// Restores `ps` from the newest whole checkpoint in `dir`, streamed as the daemon does.
inline absl::Status RestoreNewest(ParameterServer& ps, const std::string& dir,
                                  std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> ignored;
  absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestCheckpoint(
      dir, [&](CheckpointReader& reader) { return ps.Restore(reader.header(), reader); },
      warnings != nullptr ? warnings : &ignored);
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return absl::NotFoundError("no checkpoint in " + dir);
  return absl::OkStatus();
}

// One tensor of 4 floats in one partition, 2 workers, lr 1.
class MembershipTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParameterServer> Make(ServerOptions o) {
    o.world_size = 2;
    o.optimizer.learning_rate = 1.0;
    o.lease = absl::Seconds(1);
    o.clock = &clock_;
    o.require_sessions = false;
    auto ps = std::make_unique<ParameterServer>(o);
    for (int rank : {0, 1}) {
      JoinRequestView v;
      v.rank = rank;
      v.world_size = 2;
      v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
      EXPECT_TRUE(ps->Join(v).ok());
    }
    return ps;
  }
  PushRequestView Push(int rank, uint64_t step, const std::string& data, int64_t examples) {
    PushRequestView v;
    v.rank = rank;
    v.step = step;
    v.data = data;
    v.num_examples = examples;
    return v;
  }
  JoinRequestView Rejoin(int rank) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view()}};
    return v;
  }
  const std::string zeros_ = Floats4(0);
  const std::string twos_ = Floats4(2);
  FakeClock clock_;
};

}  // namespace summa::server

#endif  // SUMMA_TESTS_PARAMETER_SERVER_FIXTURES_H_
