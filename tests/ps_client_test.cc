// The worker's ParameterClient (client/ps_client.h) on the raw data path, over gRPC and over the
// socket data plane, against a real server on 127.0.0.1:0 (tests/server_fixture.h): sync steps,
// stale views, AllReduce in chunks and over shards, and garbage on the wire.
#include "client/ps_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/status_reason.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/parameter_server_peer.h"
#include "tests/server_fixture.h"
#include "tests/socket_frames.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa {
namespace {

// Two ranks, each in a thread with a client of its own from `client`, AllReduce `n` floats named
// `name` in place (rank r's element i: (r + 1) * (i % 1000)); each must end with the exact sum.
void AllReduceTwoRanksInPlace(const std::string& name, int64_t n,
                              const std::function<std::unique_ptr<worker::ParameterClient>()>& client) {
  constexpr int kGroup = 2;
  std::vector<std::vector<float>> tensors(kGroup, std::vector<float>(n));
  std::vector<absl::Status> results(kGroup);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kGroup; ++rank) {
    for (int64_t i = 0; i < n; ++i) tensors[rank][i] = float((rank + 1) * (i % 1000));
    threads.emplace_back([&, rank] {
      worker::Collective group;
      group.name = name;
      group.group_size = kGroup;
      group.rank = rank;
      results[rank] = client()->AllReduceInto(group, tensors[rank], absl::MakeSpan(tensors[rank]));
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kGroup; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << results[rank];
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += tensors[rank][i] != float(3 * (i % 1000));
    EXPECT_EQ(wrong, 0) << "rank " << rank;
  }
}

// Each test runs with its clients on gRPC and again on the socket data plane.
class RawPathTest : public ServerFixture, public ::testing::WithParamInterface<worker::DataPlane> {
 protected:
  void SetUp() override { plane_ = GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Planes, RawPathTest, ::testing::Values(worker::DataPlane::kGrpc, worker::DataPlane::kSocket),
                         [](const ::testing::TestParamInfo<worker::DataPlane>& info) {
                           return info.param == worker::DataPlane::kGrpc ? "Grpc" : "Socket";
                         });

// Rank 1 leaves; rank 0's client still holds the membership view its Join told it, so its next
// pushes are refused as stale. It asks for the view (Heartbeat) and pushes again, once: the step
// completes without the rank that left, each partition's refusal counted once.
TEST_P(RawPathTest, PushesStampedWithAStaleViewAreRefusedAndTheWorkerRefreshesAndPushesAgain) {
  configure_ = [](server::ServerOptions& o) { o.on_worker_loss = server::OnWorkerLoss::kShrink; };
  StartServer(2, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0, 1, 2, 3, 4, 5, 6, 7};
  std::unique_ptr<worker::ParameterClient> zero = Client(1), one = Client(1);
  ASSERT_TRUE(zero->Join(0, 2, specs, initial.data(), "").ok());
  ASSERT_TRUE(one->Join(1, 2, specs, nullptr, "").ok());
  ASSERT_EQ(Status().view(), 0u);
  ASSERT_TRUE(one->Leave(1).ok());
  ASSERT_EQ(Status().view(), 1u);
  std::vector<float> grad(8, 2.0f), w(8), expected(8);
  std::vector<int> live;
  absl::Status s = zero->PushPull(0, 2, grad.data(), w.data(), &live).status();
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 8; ++i) expected[i] = float(i) - 0.5f;  // rank 0 alone: 2 over 2 examples, lr 0.5
  EXPECT_EQ(w, expected);
  EXPECT_EQ(live, std::vector<int>{0});
  pb::ServerStatus status = Status();
  EXPECT_EQ(status.stale_view_pushes(), 3u);
  EXPECT_EQ(status.version(), 1u);
  // Stamped with the view it refreshed to, the next step goes through at once.
  ASSERT_TRUE(zero->PushPull(1, 2, grad.data(), w.data(), &live).ok());
  status = Status();
  EXPECT_EQ(status.stale_view_pushes(), 3u);
  EXPECT_EQ(status.version(), 2u);
}

// Every decision of the protocol is taken on a status's code and reason, never its message: with
// every message the server sends reworded, a worker over the server's join rate still joins once
// a token comes back (reason JOIN_RATE), and one whose pushes are stamped with a stale view still
// refreshes it and pushes again (STALE_VIEW).
#ifdef SUMMA_FAULT_INJECTION  // RewordStatusMessagesForTest is a test build's
TEST_P(RawPathTest, TheProtocolHoldsWhenEveryMessageIsReworded) {
  struct Reworded {
    Reworded() { RewordStatusMessagesForTest(true); }
    ~Reworded() { RewordStatusMessagesForTest(false); }
  } reworded;
  FakeClock clock;  // the join rate's tokens come back only when the test says
  configure_ = [&clock](server::ServerOptions& o) {
    o.on_worker_loss = server::OnWorkerLoss::kShrink;
    o.limits.join_rate = 1;  // a burst of max(1, 2 x 2) = 4 joins
    o.clock = &clock;
  };
  StartServer(2, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0, 1, 2, 3, 4, 5, 6, 7};
  std::unique_ptr<worker::ParameterClient> zero = Client(1), one = Client(1);
  ASSERT_TRUE(zero->Join(0, 2, specs, initial.data(), "").ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(one->Join(1, 2, specs, nullptr, "").ok());  // the burst used
  // The next join is refused until a token comes back; its client keeps asking.
  absl::Status late = absl::UnknownError("not joined");
  std::thread joiner([&] { late = one->Join(1, 2, specs, nullptr, "").status(); });
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (Status().joins_refused() == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(Status().joins_refused(), 1u);
  clock.Advance(absl::Seconds(1));
  joiner.join();
  ASSERT_TRUE(late.ok()) << late;
  // A refusal's message is indeed reworded; its code stays.
  std::vector<float> grad(8, 2.0f), w(8), expected(8);
  std::vector<int> live;
  absl::Status refused = zero->PushPull(7, 2, grad.data(), w.data(), &live).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "reworded OUT_OF_RANGE")) << refused;
  // Rank 1 leaves: rank 0's pushes are stamped with a stale view, refused, refreshed and sent again.
  ASSERT_TRUE(one->Leave(1).ok());
  absl::Status s = zero->PushPull(0, 2, grad.data(), w.data(), &live).status();
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 8; ++i) expected[i] = float(i) - 0.5f;  // rank 0 alone: 2 over 2 examples, lr 0.5
  EXPECT_EQ(w, expected);
  EXPECT_EQ(Status().stale_view_pushes(), 3u);
}
#endif

// The request buffers the gRPC data path's threads keep between calls are counted in GetStatus;
// the socket plane reads requests into buffers of its own, so over it they stay empty.
// Backup workers (--backup_workers=1 of three ranks): ranks 0 and 1 go on without rank 2, whose
// push-pull of step 0 comes back late from every partition (PullResponse.late, on either
// transport), one partition a step ahead of the others: the client pulls the others to that
// version and goes on from it, with every partition's weights of that version.
TEST_P(RawPathTest, ALatePushPullGoesOnFromTheVersionEveryPartitionIsBroughtTo) {
  configure_ = [](server::ServerOptions& o) {
    o.backup_workers = 1;
    o.require_sessions = false;  // the test pushes to the core as ranks 0 and 1 too
    o.deterministic = true;
  };
  StartServer(3, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0, 1, 2, 3, 4, 5, 6, 7};
  std::unique_ptr<worker::ParameterClient> clients[3] = {Client(1), Client(1), Client(1)};
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(clients[r]->Join(r, 3, specs, r == 0 ? initial.data() : nullptr, "").ok()) << r;
  }
  const std::vector<float> grad(8, 1.0f);
  for (uint64_t step = 0; step < 3; ++step) {
    absl::StatusOr<uint64_t> next[2];
    std::vector<float> w[2] = {std::vector<float>(8), std::vector<float>(8)};
    std::thread one([&] { next[1] = clients[1]->PushPull(step, 1, grad.data(), w[1].data(), nullptr); });
    next[0] = clients[0]->PushPull(step, 1, grad.data(), w[0].data(), nullptr);
    one.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(next[r].ok()) << next[r].status();
      EXPECT_EQ(*next[r], step + 1);
    }
  }
  // Step 3 of partition 0 (ids in offset order) completes: it is a step ahead of the others.
  server::ParameterServer& core = server_->core();
  const std::string three = std::string(3 * sizeof(float), '\0'), two = std::string(2 * sizeof(float), '\0');
  auto push = [&](int rank, uint32_t partition) {
    server::PushRequestView v;
    v.rank = rank;
    v.step = 3;
    v.partition = partition;
    v.num_examples = 1;
    v.data = partition == 2 ? two : three;
    return core.Push(v).status();
  };
  for (int r : {0, 1}) ASSERT_TRUE(push(r, 0).ok());
  absl::StatusOr<uint64_t> late;
  std::vector<float> weights(8);
  std::vector<int> live;
  std::thread waiting([&] { late = clients[2]->PushPull(0, 1, grad.data(), weights.data(), &live); });
  // Its pulls of partitions 1 and 2 wait for version 4.
  for (int tries = 0; Status().parked_calls() < 2 && tries < 1000; ++tries) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Status().parked_calls(), 2);
  for (uint32_t p : {1u, 2u}) {
    for (int r : {0, 1}) EXPECT_TRUE(push(r, p).ok());
  }
  waiting.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, 4u);
  EXPECT_EQ(weights, server::ParameterServerPeer::Weights(core));
  EXPECT_EQ(live, (std::vector<int>{0, 1, 2}));
  const pb::ServerStatus status = Status();
  EXPECT_EQ(status.backup_workers(), 1);
  EXPECT_EQ(status.late_pushes(), 3u);  // one a partition
  ASSERT_EQ(status.members_size(), 3);
  EXPECT_EQ(status.members(2).late_pushes(), 3u);
  EXPECT_EQ(status.members(2).steps_behind(), 4u);  // partition 0's
  EXPECT_EQ(status.members(0).late_pushes(), 0u);
  // The client says so to a caller that cannot skip (a staged step): the reason, not a guess.
  ASSERT_TRUE(clients[2]->BeginStaged(0, 1, grad.data(), weights.data()).ok());
  for (size_t i = 0; i < 3; ++i) clients[2]->StartStaged(i);
  size_t i;
  absl::Status staged;
  ASSERT_TRUE(clients[2]->NextStaged(&i, &staged));
  EXPECT_TRUE(IsLatePush(staged)) << staged;
  while (clients[2]->NextStaged(&i, &staged)) {
  }
}

// A staged step on a 16-bit wire sends each partition as soon as it is started, encoded alone:
// with one worker, partition 2's push-pull completes before any other partition is started.
// The step ends on the blocking PushPull's weights, bit for bit, each of them a bf16 value.
TEST_P(RawPathTest, AStagedStepOnASixteenBitWireSendsEachPartitionAsItIsStarted) {
  configure_ = [](server::ServerOptions& o) {
    o.wire_dtype = WireDType::kBfloat16;
    o.optimizer.learning_rate = 0.5;
  };
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0.11f, 1.13f, 2.17f, 3.19f, 4.23f, 5.29f, 6.31f, 7.37f};
  const std::vector<float> grad = {0.013f, -0.29f, 0.0071f, 1.7f, -3.1f, 0.77f, 2.9f, -0.043f};
  auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  StartServer(1, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  ASSERT_TRUE(client->Join(0, 1, specs, initial.data(), "").ok());
  std::vector<float> staged_weights(8);
  ASSERT_TRUE(client->BeginStaged(0, 1, grad.data(), staged_weights.data()).ok());
  client->StartStaged(2);
  size_t i = 99;
  absl::Status st;
  ASSERT_TRUE(client->NextStaged(&i, &st)) << "partition 2 did not go when it was started";
  EXPECT_EQ(i, 2u);
  ASSERT_TRUE(st.ok()) << st;
  client->StartStaged(0);
  client->StartStaged(1);
  int replies = 0;
  while (client->NextStaged(&i, &st)) {
    ASSERT_TRUE(st.ok()) << st;
    ++replies;
  }
  EXPECT_EQ(replies, 2);
  client.reset();
  server_.reset();

  StartServer(1, /*partition_bytes=*/12);
  client = Client(1);
  ASSERT_TRUE(client->Join(0, 1, specs, initial.data(), "").ok());
  std::vector<float> blocking_weights(8);
  ASSERT_TRUE(client->PushPull(0, 1, grad.data(), blocking_weights.data(), nullptr).ok());
  EXPECT_EQ(bits(staged_weights), bits(blocking_weights));
  EXPECT_NE(bits(blocking_weights), bits(initial)) << "the step moved nothing";
  for (uint32_t b : bits(staged_weights)) EXPECT_EQ(b & 0xFFFFu, 0u) << "not a bf16 value: the wire was not bf16";
}

TEST_P(RawPathTest, TheRequestBuffersThreadsKeepAreCountedInTheStatus) {
  StartServer(1, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  EXPECT_EQ(Status().request_buffer_bytes(), 0);
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0, 1, 2, 3, 4, 5, 6, 7};
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  ASSERT_TRUE(client->Join(0, 1, specs, initial.data(), "").ok());
  std::vector<float> grad(8, 2.0f), w(8);
  std::vector<int> live;
  ASSERT_TRUE(client->PushPull(0, 1, grad.data(), w.data(), &live).ok());
  const int64_t kept = Status().request_buffer_bytes();
  if (plane_ == worker::DataPlane::kSocket) {
    EXPECT_EQ(kept, 0);
  } else {
    // At least one thread read a whole partition's values; none keeps more than 16 MiB.
    EXPECT_GE(kept, 12);
    EXPECT_LE(kept, int64_t{64} * (16 << 20));
  }
}

TEST_P(RawPathTest, WorkersOverSeveralChannelsTakeExactSyncSteps) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 4;
  StartServer(kWorkers, /*partition_bytes=*/12);  // 8 floats in partitions of 3, 3, 2
  const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {8}}};
  const std::vector<float> initial = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::vector<float>> finals(kWorkers);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<worker::ParameterClient> client = Client(/*channels=*/2);
      absl::StatusOr<worker::JoinInfo> joined = client->Join(rank, kWorkers, specs, initial.data(), "");
      ASSERT_TRUE(joined.ok()) << joined.status();
      ASSERT_EQ(joined->partitions.size(), 3u);
      std::vector<float> w(8, -1);
      ASSERT_TRUE(client->PullAll(0, w.data()).ok());
      ASSERT_EQ(w, initial);
      std::vector<float> grad(8);
      for (int step = 0; step < kSteps; ++step) {
        // Rank r pushes element i as (r + 1) * (i + 1) over r + 1 examples.
        for (int i = 0; i < 8; ++i) grad[i] = float((rank + 1) * (i + 1));
        absl::Status s = client->PushPull(step, rank + 1, grad.data(), w.data(), nullptr).status();
        ASSERT_TRUE(s.ok()) << s;
      }
      EXPECT_EQ(client->on_socket_plane(), plane_ == worker::DataPlane::kSocket);
      finals[rank] = w;
    });
  }
  for (auto& t : threads) t.join();
  // Each step: the sum is 3 * (i + 1) over 3 examples, so w[i] -= 0.5 * (i + 1).
  std::vector<float> expected(8);
  for (int i = 0; i < 8; ++i) expected[i] = float(i) - kSteps * 0.5f * float(i + 1);
  for (int rank = 0; rank < kWorkers; ++rank) EXPECT_EQ(finals[rank], expected) << "rank " << rank;
  EXPECT_EQ(server::ParameterServerPeer::Weights(server_->core()), expected);
}

TEST_P(RawPathTest, ABigTensorIsSummedInChunksInPlace) {
  StartServer(1, 4 << 20);
  // Two whole chunks and a tail of 5.
  const int64_t n = 2 * worker::ParameterClient::kAllReduceChunkBytes / 4 + 5;
  AllReduceTwoRanksInPlace("big", n, [&] { return Client(/*channels=*/3); });
  grpc::ClientContext ctx;
  pb::ServerStatus status;
  auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.allreduce_rounds(), 3u);  // one round of each chunk's collective
}

TEST(AllReducePlanTest, OneServerCutsAt4MiBAndShardsShareAFixedGroupsTensorEqually) {
  using worker::ParameterClient;
  static constexpr int64_t kChunk = ParameterClient::kAllReduceChunkBytes / 4;
  static constexpr int64_t kSpread = ParameterClient::kMinSpreadChunkBytes / 4;
  auto plan = [](int64_t floats, int shards, bool members) {
    const ParameterClient::AllReducePlan p = ParameterClient::PlanAllReduce(floats, shards, members);
    // Whatever the cut, the chunks tile [0, floats) in order, none empty but a lone one.
    int64_t next = 0;
    for (int64_t k = 0; k < p.count; ++k) {
      const auto [begin, length] = p.Range(k);
      EXPECT_EQ(begin, next) << "chunk " << k << " of " << floats;
      EXPECT_TRUE(length > 0 || p.count == 1) << "chunk " << k << " of " << floats;
      EXPECT_LE(length, kChunk);
      next = begin + length;
    }
    EXPECT_EQ(next, floats);
    return std::make_tuple(p.count, p.chunk_floats, p.shards);
  };
  // One server: whole 4 MiB chunks and a tail, as summa.v1 clients (the Python one) cut them.
  EXPECT_EQ(plan(0, 1, false), std::make_tuple(1, kChunk, 1));
  EXPECT_EQ(plan(2 * kChunk + 5, 1, false), std::make_tuple(3, kChunk, 1));
  // Two or four shards: one chunk a shard where each holds 256 KiB, all of one size.
  EXPECT_EQ(plan(2 * kSpread - 1, 2, false), std::make_tuple(1, 2 * kSpread - 1, 2));
  EXPECT_EQ(plan(2 * kSpread, 2, false), std::make_tuple(2, kSpread, 2));
  EXPECT_EQ(plan(2 * kSpread + 1, 2, false), std::make_tuple(2, kSpread + 1, 2));
  EXPECT_EQ(plan(3 * kSpread, 4, false), std::make_tuple(3, kSpread, 4));
  EXPECT_EQ(plan(kChunk, 4, false), std::make_tuple(4, kChunk / 4, 4));
  // Bigger tensors: a multiple of the shard count of chunks up to 4 MiB, equal shares.
  EXPECT_EQ(plan(kChunk + 1, 2, false), std::make_tuple(2, kChunk / 2 + 1, 2));
  EXPECT_EQ(plan(5 * kChunk, 4, false), std::make_tuple(8, 5 * kChunk / 8, 4));
  EXPECT_EQ(plan(5 * kChunk + 7, 2, false), std::make_tuple(6, (5 * kChunk + 7 + 5) / 6, 2));
  // The members' collectives stay on shard 0, cut as on one server.
  EXPECT_EQ(plan(5 * kChunk, 2, true), std::make_tuple(5, kChunk, 1));
  const ParameterClient::AllReducePlan members = ParameterClient::PlanAllReduce(5 * kChunk, 2, true);
  for (int64_t k = 0; k < members.count; ++k) EXPECT_EQ(members.Shard(k), 0);
  const ParameterClient::AllReducePlan fixed = ParameterClient::PlanAllReduce(5 * kChunk, 4, false);
  for (int64_t k = 0; k < fixed.count; ++k) EXPECT_EQ(fixed.Shard(k), k % 4);
}

// Two shards, a fixed group of two ranks, a 1 MiB tensor and a tail: each shard sums one chunk,
// and every rank gets the exact sum.
TEST(ShardedAllReduceTest, AFixedGroupsTensorIsSummedHalfOnEachShard) {
  for (worker::DataPlane plane : {worker::DataPlane::kGrpc, worker::DataPlane::kSocket}) {
    std::vector<std::unique_ptr<server::SummaServer>> shards;
    std::vector<std::string> addresses;
    for (int i = 0; i < 2; ++i) {
      server::ServerOptions o;
      o.world_size = 2;
      o.shards = 2;
      o.shard = i;
      o.barrier_deadline = absl::Seconds(20);
      auto s = server::SummaServer::Start("127.0.0.1:0", o, "", {}, "", {}, "127.0.0.1:0");
      ASSERT_TRUE(s.ok()) << s.status();
      addresses.push_back("127.0.0.1:" + std::to_string((*s)->port()));
      shards.push_back(*std::move(s));
    }
    AllReduceTwoRanksInPlace("halves", (1 << 20) / 4 + 3, [&] {
      auto client = std::make_unique<worker::ParameterClient>(absl::StrJoin(addresses, ","), absl::Seconds(20),
                                                              absl::Seconds(20), /*channels=*/1);
      client->set_data_plane(plane);
      return client;
    });
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      pb::ServerStatus status;
      auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(addresses[i], grpc::InsecureChannelCredentials()));
      ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
      // One round of its one chunk.
      EXPECT_EQ(status.allreduce_rounds(), 1u) << "shard " << i << (plane == worker::DataPlane::kSocket ? ", socket" : "");
    }
  }
}

// The socket data plane's frames, written and read by hand.
using test::AllReduceMessage;
using test::ClosedByServer;
using test::Eventually;
using test::kAllReduceMethod;
using test::RawConnect;
using test::RawReply;
using test::ReadReply;
using test::SendBytes;
using test::SendHello;
using test::SendRequest;

TEST_P(RawPathTest, GarbageOnTheWireIsInvalidArgumentAndChangesNothing) {
  StartServer(1, 4 << 20);
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  socket_plane::OwnedFd plane;
  if (plane_ == worker::DataPlane::kSocket) {
    plane = RawConnect(server_->data_port());
    SendHello(plane.get(), "");
    absl::StatusOr<RawReply> hello = ReadReply(plane.get());
    ASSERT_TRUE(hello.ok()) << hello.status();
    ASSERT_EQ(hello->header.code, 0u) << hello->message;
  }
  for (const char* method : {"/summa.v1.ParameterServer/Push", "/summa.v1.ParameterServer/PushPull",
                             "/summa.v1.ParameterServer/Pull", "/summa.v1.ParameterServer/AllReduce"}) {
    const std::string garbage_bytes("\x02\x01x\xff", 4);
    if (plane_ == worker::DataPlane::kSocket) {
      // The same connection carries every call: a refused one leaves it usable.
      SendRequest(plane.get(), static_cast<uint32_t>(*DataMethodOf(method)), garbage_bytes);
      absl::StatusOr<RawReply> reply = ReadReply(plane.get());
      ASSERT_TRUE(reply.ok()) << reply.status();
      EXPECT_EQ(reply->header.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument)) << method;
      EXPECT_TRUE(absl::StrContains(reply->message, "malformed")) << reply->message;
      EXPECT_TRUE(reply->body.empty());
      continue;
    }
    grpc::Slice garbage(garbage_bytes);
    grpc::ByteBuffer request(&garbage, 1), reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &reply, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(status.error_message().find("malformed"), std::string::npos) << status.error_message();
  }
  pb::ServerStatus status = Status();
  EXPECT_EQ(status.pushes_served(), 0u);
  EXPECT_FALSE(status.model_defined());
  if (plane_ == worker::DataPlane::kSocket) {
    // ...and the next call on it goes through: a group of one gets its own tensor back.
    const std::vector<float> values = {1.5f, -2.0f, 3.25f};
    SendRequest(plane.get(), kAllReduceMethod, AllReduceMessage("solo", 1, 0, values));
    absl::StatusOr<RawReply> reply = ReadReply(plane.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->header.code, 0u) << reply->message;
    pb::AllReduceResponse response;
    ASSERT_TRUE(response.ParseFromString(reply->body));
    EXPECT_EQ(response.tensor().data(), std::string(reinterpret_cast<const char*>(values.data()), 12));
  }
}

}  // namespace
}  // namespace summa
