// The daemon in-process on 127.0.0.1:0, driven through real gRPC stubs by client threads.
#include "server/daemon.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/health_service.h"
#include "gtest/gtest.h"
#include "tests/parameter_server_peer.h"
#include "tests/service_fixtures.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {
namespace {

TEST_F(ServiceTest, WorkersInThreadsTakeSyncStepsThroughPushPull) {
  constexpr int kWorkers = 3;
  constexpr int kSteps = 5;
  StartServer(kWorkers, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  {
    auto stub = Stub();
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::JoinResponse r;
    ASSERT_TRUE(stub->Join(&ctx, JoinMsg(0, kWorkers, true), &r).ok());
    ASSERT_EQ(r.partitions_size(), 3);
  }
  std::vector<std::vector<float>> finals(kWorkers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      auto stub = Stub();
      pb::JoinResponse joined;
      {
        grpc::ClientContext ctx;
        Deadline(ctx);
        ASSERT_TRUE(stub->Join(&ctx, JoinMsg(rank, kWorkers, false), &joined).ok());
      }
      std::vector<float> w(8, 0);
      for (int step = 0; step < kSteps; ++step) {
        for (const pb::Partition& p : joined.partitions()) {
          // Rank r pushes (r + 1) * (step + 1) for each element over r + 1 examples.
          pb::PushRequest push;
          push.set_rank(rank);
          push.set_step(step);
          push.set_partition(p.id());
          push.set_num_examples(rank + 1);
          push.set_dtype(pb::DTYPE_FLOAT32);
          push.set_data(Bytes(std::vector<float>(p.length(), float((rank + 1) * (step + 1)))));
          grpc::ClientContext ctx;
          Deadline(ctx);
          pb::PullResponse pulled;
          grpc::Status s = stub->PushPull(&ctx, push, &pulled);
          ASSERT_TRUE(s.ok()) << s.error_message();
          ASSERT_EQ(pulled.version(), uint64_t(step + 1));
          std::vector<float> v = Floats(pulled.data());
          std::copy(v.begin(), v.end(), w.begin() + p.offset());
        }
      }
      finals[rank] = w;
    });
  }
  for (auto& t : threads) t.join();
  // Each step: sum = 6 * (step + 1) over 6 examples, lr 0.5 -> w -= 0.5 * (step + 1).
  float expected = 0;
  for (int step = 0; step < kSteps; ++step) expected -= 0.5f * (step + 1);
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_EQ(finals[rank], std::vector<float>(8, expected)) << "rank " << rank;
  }
  auto stub = Stub();
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::ServerStatus status;
  ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.version(), uint64_t(kSteps));
  EXPECT_EQ(status.members_size(), kWorkers);
  EXPECT_EQ(status.pushes_served(), uint64_t(kWorkers * kSteps * 3));
  EXPECT_EQ(status.parameter_count(), 8);
  EXPECT_EQ(status.bytes_in(), uint64_t(kWorkers * kSteps * 32));
}

TEST_F(ServiceTest, WireFormatsAreAnnouncedAtJoinAndRepliesComeInTheDtypeAsked) {
  configure_ = [](ServerOptions& o) {
    o.wire_dtype = WireDType::kBfloat16;
    o.compression.topk_ratio = 0.25;
  };
  StartServer(1);
  auto stub = Stub();
  pb::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    ASSERT_TRUE(stub->Join(&ctx, JoinMsg(0, 1, true), &joined).ok());
  }
  EXPECT_EQ(joined.wire_dtype(), pb::DTYPE_BFLOAT16);
  EXPECT_EQ(joined.topk_ratio(), 0.25);
  auto halves = [](WireDType dtype, const std::vector<float>& v) {
    std::string out(v.size() * 2, '\0');
    EncodeValues(dtype, v, out.data());
    return out;
  };
  auto widen = [](WireDType dtype, const std::string& b) {
    std::vector<float> v(b.size() / 2);
    DecodeValues(dtype, b.data(), absl::MakeSpan(v));
    return v;
  };
  // A sparse bf16 push-pull of 2 of the 8 values, 1 example at lr 0.5; the reply comes in bf16.
  pb::PushRequest push;
  push.set_rank(0);
  push.set_partition(0);
  push.set_num_examples(1);
  push.set_dtype(pb::DTYPE_BFLOAT16);
  push.set_sparse(true);
  const uint32_t positions[] = {2, 5};
  push.set_data(std::string(reinterpret_cast<const char*>(positions), 8) + halves(WireDType::kBfloat16, {1, -2}));
  const std::vector<float> want = {0, 0, -0.5f, 0, 0, 1, 0, 0};
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::PullResponse pulled;
    ASSERT_TRUE(stub->PushPull(&ctx, push, &pulled).ok());
    EXPECT_EQ(pulled.dtype(), pb::DTYPE_BFLOAT16);
    EXPECT_EQ(widen(WireDType::kBfloat16, pulled.data()), want);
  }
  // A pull names its dtype: fp16, or float32 when unset; an unknown one is refused.
  for (pb::DType dtype : {pb::DTYPE_FLOAT16, pb::DTYPE_UNSPECIFIED, static_cast<pb::DType>(7)}) {
    pb::PullRequest pull;
    pull.set_rank(0);
    pull.set_min_version(1);
    pull.set_dtype(dtype);
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::PullResponse pulled;
    grpc::Status s = stub->Pull(&ctx, pull, &pulled);
    if (dtype == 7) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(s.error_message(), "a pull's dtype must be DTYPE_FLOAT32 (or unset), DTYPE_BFLOAT16 or "
                                   "DTYPE_FLOAT16, not 7");
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (dtype == pb::DTYPE_FLOAT16) {
      EXPECT_EQ(pulled.dtype(), pb::DTYPE_FLOAT16);
      EXPECT_EQ(widen(WireDType::kFloat16, pulled.data()), want);
    } else {
      EXPECT_EQ(pulled.dtype(), pb::DTYPE_FLOAT32);
      EXPECT_EQ(Floats(pulled.data()), want);
    }
  }
  // A push of a dtype the server does not know is refused, naming the ones it does.
  push.set_step(1);
  push.set_dtype(static_cast<pb::DType>(9));
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::PushResponse r;
    grpc::Status s = stub->Push(&ctx, push, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "gradients must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16, not 9");
  }
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::ServerStatus status;
  ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.wire_dtype(), "bf16");
  EXPECT_EQ(status.compress(), "topk:0.25");
  // In: 2 positions and 2 bf16 values. Out: the bytes of each reply as it went (bf16, fp16, fp32).
  EXPECT_EQ(status.bytes_in(), 12u);
  EXPECT_EQ(status.bytes_out(), 16u + 16u + 32u);
}

TEST_F(ServiceTest, ConcurrentAllReduceCallersAllReceiveTheSum) {
  StartServer(1);
  constexpr int kGroup = 4;
  constexpr int kRounds = 3;
  std::vector<std::thread> threads;
  std::vector<int> ok(kGroup, 0);
  for (int rank = 0; rank < kGroup; ++rank) {
    threads.emplace_back([&, rank] {
      auto stub = Stub();
      for (int round = 0; round < kRounds; ++round) {
        pb::AllReduceRequest req;
        req.set_name("demo");
        req.set_group_size(kGroup);
        req.set_rank(rank);
        req.mutable_tensor()->set_name("x");
        req.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
        req.mutable_tensor()->add_shape(2);
        req.mutable_tensor()->set_data(Bytes({float(rank), float(round)}));
        grpc::ClientContext ctx;
        Deadline(ctx);
        pb::AllReduceResponse resp;
        grpc::Status s = stub->AllReduce(&ctx, req, &resp);
        ASSERT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(Floats(resp.tensor().data()), (std::vector<float>{6, float(kGroup * round)}));
        EXPECT_EQ(resp.round(), uint64_t(round));
        ++ok[rank];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(kGroup, kRounds));
}

TEST_F(ServiceTest, BadInputGetsPreciseStatusesOverTheWire) {
  StartServer(2);
  auto stub = Stub();
  pb::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    ASSERT_TRUE(stub->Join(&ctx, JoinMsg(0, 2, true), &joined).ok());
  }
  auto push = [&](pb::PushRequest req) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::PushResponse resp;
    return stub->Push(&ctx, req, &resp);
  };
  pb::PushRequest good;
  good.set_rank(0);
  good.set_partition(0);
  good.set_num_examples(1);
  good.set_dtype(pb::DTYPE_FLOAT32);
  good.set_data(Bytes(std::vector<float>(8, 1)));
  pb::PushRequest bad_dtype = good;
  bad_dtype.set_dtype(pb::DTYPE_UNSPECIFIED);
  pb::PushRequest bad_len = good;
  bad_len.set_data("abc");
  pb::PushRequest bad_rank = good;
  bad_rank.set_rank(9);
  pb::PushRequest future = good;
  future.set_step(3);
  EXPECT_EQ(push(bad_dtype).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(push(bad_len).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(push(bad_rank).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(push(future).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_TRUE(push(good).ok());
  EXPECT_EQ(push(good).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  // A join whose model differs.
  pb::JoinRequest other = JoinMsg(1, 2, false);
  other.mutable_params(0)->set_shape(0, 9);
  grpc::ClientContext jctx;
  Deadline(jctx);
  grpc::Status js = stub->Join(&jctx, other, &joined);
  EXPECT_EQ(js.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(js.error_message().find("model mismatch"), std::string::npos) << js.error_message();

  // AllReduce members that disagree on shape.
  pb::AllReduceRequest a;
  a.set_name("x");
  a.set_group_size(2);
  a.set_rank(0);
  a.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
  a.mutable_tensor()->add_shape(1);
  a.mutable_tensor()->set_data(Bytes({1}));
  pb::AllReduceRequest b = a;
  b.set_rank(1);
  b.mutable_tensor()->set_shape(0, 2);
  b.mutable_tensor()->set_data(Bytes({1, 2}));
  // Whichever arrives first sets the round's shape; the other is refused at once, and the first
  // waits out its 2 s deadline alone. No ordering is assumed.
  grpc::StatusCode codes[2];
  std::thread callers[2];
  for (int i = 0; i < 2; ++i) {
    callers[i] = std::thread([&, i] {
      grpc::ClientContext ctx;
      Deadline(ctx, 2);
      pb::AllReduceResponse ar;
      codes[i] = stub->AllReduce(&ctx, i == 0 ? a : b, &ar).error_code();
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(std::min(codes[0], codes[1]), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(std::max(codes[0], codes[1]), grpc::StatusCode::DEADLINE_EXCEEDED);

  // The weights are untouched: nothing above completed a step.
  EXPECT_EQ(ParameterServerPeer::Weights(server_->core()), std::vector<float>(8, 0));
}

TEST_F(ServiceTest, ParkedPullEndsAtTheClientsDeadline) {
  StartServer(2);
  auto stub = Stub();
  pb::JoinResponse joined;
  grpc::ClientContext jctx;
  Deadline(jctx);
  ASSERT_TRUE(stub->Join(&jctx, JoinMsg(0, 2, true), &joined).ok());
  pb::PullRequest pull;
  pull.set_rank(0);
  pull.set_min_version(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  pb::PullResponse resp;
  const absl::Time start = absl::Now();
  EXPECT_EQ(stub->Pull(&ctx, pull, &resp).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The server still works after the cancelled call.
  grpc::ClientContext sctx;
  Deadline(sctx);
  pb::ServerStatus status;
  EXPECT_TRUE(stub->GetStatus(&sctx, pb::GetStatusRequest(), &status).ok());
}

// A parked pull whose client gave up is answered then (CANCELLED) and is no longer parked: the
// server's count of parked calls comes down without waiting for the step to complete.
TEST_F(ServiceTest, AParkedPullWhoseClientWentAwayIsNoLongerParked) {
  // The pull's own deadline is far beyond Eventually's 20 s: only the cancellation can end it.
  configure_ = [](ServerOptions& o) { o.barrier_deadline = absl::Minutes(10); };
  StartServer(2);
  auto stub = Stub();
  JoinTwo(*stub);
  auto parked_calls = [&] {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::ServerStatus status;
    EXPECT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
    return status.parked_calls();
  };
  pb::PullRequest pull;
  pull.set_rank(0);
  pull.set_min_version(1);  // step 0 never completes here
  grpc::ClientContext ctx;
  pb::PullResponse resp;
  std::thread puller([&] {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    EXPECT_EQ(stub->Pull(&ctx, pull, &resp).error_code(), grpc::StatusCode::CANCELLED);
  });
  EXPECT_TRUE(Eventually([&] { return parked_calls() == 1; }));
  ctx.TryCancel();
  puller.join();
  EXPECT_TRUE(Eventually([&] { return parked_calls() == 0; }));
}

TEST_F(ServiceTest, RetriedPushPullAndNonFiniteGradientsOverTheWire) {
  StartServer(2);
  auto stub = Stub();
  JoinTwo(*stub);
  auto push = [&](int rank, uint64_t step, std::vector<float> g, pb::PullResponse* out) {
    pb::PushRequest r;
    r.set_rank(rank);
    r.set_step(step);
    r.set_num_examples(1);
    r.set_dtype(pb::DTYPE_FLOAT32);
    r.set_data(Bytes(g));
    grpc::ClientContext ctx;
    Deadline(ctx);
    return stub->PushPull(&ctx, r, out);
  };
  // A NaN is refused, naming where it is; nothing changes.
  std::vector<float> bad(8, 1.0f);
  bad[5] = std::nanf("");
  pb::PullResponse reply;
  grpc::Status refused = push(1, 0, bad, &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("element 5 is nan"), std::string::npos) << refused.error_message();
  // Step 0 from both ranks, concurrently.
  pb::PullResponse r0, r1;
  std::thread other([&] { ASSERT_TRUE(push(1, 0, std::vector<float>(8, 2), &r1).ok()); });
  ASSERT_TRUE(push(0, 0, std::vector<float>(8, 2), &r0).ok());
  other.join();
  // Rank 0's reply was lost after the step completed: its retry gets version 1, counted once.
  pb::PullResponse retried;
  grpc::Status s = push(0, 0, std::vector<float>(8, 40), &retried);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(retried.version(), 1u);
  EXPECT_EQ(Floats(retried.data()), std::vector<float>(8, -1));  // 0 - 0.5 * (2 + 2) / 2
  grpc::ClientContext sctx;
  Deadline(sctx);
  pb::ServerStatus status;
  ASSERT_TRUE(stub->GetStatus(&sctx, pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.duplicate_pushes(), 1u);
  EXPECT_EQ(status.nonfinite_pushes(), 1u);
  EXPECT_EQ(status.nonfinite(), "reject");
  EXPECT_EQ(ParameterServerPeer::Weights(server_->core()), std::vector<float>(8, -1));
}

// An elastic job (--workers=2:3) whose partitions are a step apart when a worker joins: the
// joiner is in from the step after next, and each reply names the group of the step its version
// starts, not the group as it will be, so the workers split the next step over the ranks that
// push it.
TEST_F(ServiceTest, RepliesNameTheGroupOfTheStepTheyStartWhileAJoinerWaits) {
  configure_ = [](ServerOptions& o) {
    o.min_workers = 2;
    o.world_size = 3;
  };
  StartServer(3, /*partition_bytes=*/16);  // the 8 floats in two partitions
  auto stub = Stub();
  JoinTwo(*stub);
  auto push = [&](int rank, uint64_t step, uint32_t partition, pb::PullResponse* out) {
    pb::PushRequest r;
    r.set_rank(rank);
    r.set_step(step);
    r.set_partition(partition);
    r.set_num_examples(1);
    r.set_dtype(pb::DTYPE_FLOAT32);
    r.set_data(Bytes({1, 1, 1, 1}));
    grpc::ClientContext ctx;
    Deadline(ctx);
    return stub->PushPull(&ctx, r, out);
  };
  auto ranks = [](const pb::PullResponse& r) { return std::vector<int>(r.live_ranks().begin(), r.live_ranks().end()); };
  pb::PullResponse p0, p1;
  std::thread other([&] { ASSERT_TRUE(push(1, 0, 0, &p1).ok()); });
  ASSERT_TRUE(push(0, 0, 0, &p0).ok());  // partition 0 at version 1, partition 1 at 0
  other.join();
  EXPECT_EQ(ranks(p0), (std::vector<int>{0, 1}));
  grpc::ClientContext jctx;
  Deadline(jctx);
  pb::JoinResponse joined;
  ASSERT_TRUE(stub->Join(&jctx, JoinMsg(-1, 2, false), &joined).ok());
  EXPECT_EQ(joined.rank(), 2);
  EXPECT_EQ(joined.next_step(), 2u);
  EXPECT_EQ(std::vector<int>(joined.live_ranks().begin(), joined.live_ranks().end()), (std::vector<int>{0, 1, 2}));
  // Partition 1 completes step 0 after the join: its reply starts step 1, still {0, 1}'s.
  std::thread again([&] { ASSERT_TRUE(push(1, 0, 1, &p1).ok()); });
  ASSERT_TRUE(push(0, 0, 1, &p0).ok());
  again.join();
  EXPECT_EQ(p0.version(), 1u);
  EXPECT_EQ(ranks(p0), (std::vector<int>{0, 1}));
  EXPECT_EQ(ranks(p1), (std::vector<int>{0, 1}));
  // Step 1's replies start step 2, the joiner's first.
  std::thread third([&] { ASSERT_TRUE(push(1, 1, 0, &p1).ok()); });
  ASSERT_TRUE(push(0, 1, 0, &p0).ok());
  third.join();
  EXPECT_EQ(p0.version(), 2u);
  EXPECT_EQ(ranks(p0), (std::vector<int>{0, 1, 2}));
}

TEST_F(ServiceTest, CheckpointRpcWritesFromTheDaemonsThread) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("summa-service-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions o;
  o.world_size = 1;
  o.checkpoint_dir = dir;
  auto started = SummaServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = *std::move(started);
  auto stub = Stub();
  grpc::ClientContext jctx;
  Deadline(jctx);
  pb::JoinResponse joined;
  ASSERT_TRUE(stub->Join(&jctx, JoinMsg(0, 1, true), &joined).ok());
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::CheckpointResponse written;
  grpc::Status s = stub->Checkpoint(&ctx, pb::CheckpointRequest(), &written);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(written.version(), 0u);
  EXPECT_TRUE(std::filesystem::exists(written.path())) << written.path();
  server_.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(ServiceTest, ASecondServerOnATakenPortFailsToStart) {
  StartServer(1);
  ServerOptions o;
  auto second = SummaServer::Start("127.0.0.1:" + std::to_string(server_->port()), o);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos) << second.status();
}

// No method of the server is a callback: with one, gRPC's callback threads poll the sockets
// beside the data path's threads and hand every call over to them (server/rpc/service.h). The data
// path is async, the rest synchronous, and so is the health service registered beside them.
TEST(ServiceShapeTest, NoMethodIsServedByGrpcsCallbackThreads) {
  ServerOptions o;
  o.world_size = 1;
  ParameterServer core(o);
  AllReduceHub hub(o.barrier_deadline, o.clock, &core.membership(), o.limits);
  const TokenCheck tokens;
  ParameterServerService service(&core, &hub, [](std::function<void()> task) { task(); }, &tokens);
  EXPECT_FALSE(service.has_callback_methods());
  EXPECT_TRUE(service.has_async_methods());
  HealthService health(std::vector<std::string>{"summa.v1.ParameterServer"});
  EXPECT_FALSE(health.has_callback_methods());
}

}  // namespace
}  // namespace summa::server
