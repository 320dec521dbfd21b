// The raw data path: common/rpc/wire.h's codec against protobuf's own encoding, and the worker's
// ParameterClient (raw on both sides) against a real server on 127.0.0.1:0.
#include "common/rpc/wire.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "common/clock.h"
#include "tests/parameter_server_peer.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/socket_frame.h"
#include "common/status_reason.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"
#include "common/rpc/transport.h"
#include "server/daemon.h"
#include "tests/socket_frames.h"
#include "summa/v1/summa.pb.h"
#include "client/ps_client.h"
#include "client/socket_calls.h"

namespace summa {
namespace {

namespace pb = ::summa::v1;

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `encoded` cut into slices at the given offsets, as gRPC's receive path hands a message over.
grpc::ByteBuffer Sliced(const std::string& encoded, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  cuts.push_back(encoded.size());
  for (size_t end : cuts) {
    slices.emplace_back(encoded.data() + begin, end - begin);
    begin = end;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

pb::AllReduceRequest SampleRequest() {
  pb::AllReduceRequest r;
  r.set_name("loss");
  r.set_group_size(3);
  r.set_rank(2);
  r.set_round(7);
  r.mutable_tensor()->set_name("t");
  r.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
  r.mutable_tensor()->add_shape(5);
  r.mutable_tensor()->set_data(Bytes({1.5f, -2, 3, 4e20f, 5}));
  return r;
}

constexpr int kTensorData[] = {pb::AllReduceRequest::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};

TEST(WireTest, TheValuesComeOutWholeAndEveryOtherFieldIntoTheHeader) {
  const pb::AllReduceRequest sent = SampleRequest();
  const std::string encoded = sent.SerializeAsString();
  // Cuts inside the tag, the nested header and the values (a float split across slices).
  grpc::ByteBuffer buffer = Sliced(encoded, {1, 9, encoded.size() - 7, encoded.size() - 1});
  Scratch values;
  pb::AllReduceRequest header;
  ASSERT_TRUE(ParseWithBytes(buffer, kTensorData, IntoScratch(&values), &header).ok());
  EXPECT_EQ(values.view(), sent.tensor().data());
  pb::AllReduceRequest expected = sent;
  expected.mutable_tensor()->clear_data();
  EXPECT_EQ(header.SerializeAsString(), expected.SerializeAsString());
}

TEST(WireTest, APrefixAndAValuesSliceAreTheMessageProtobufWouldEncode) {
  const pb::AllReduceRequest whole = SampleRequest();
  pb::Tensor tensor = whole.tensor();
  tensor.clear_data();
  const std::string& data = whole.tensor().data();
  std::string tensor_prefix = tensor.SerializeAsString();
  AppendFieldHeader(pb::Tensor::kDataFieldNumber, data.size(), &tensor_prefix);
  pb::AllReduceRequest outer = whole;
  outer.clear_tensor();
  std::string prefix = outer.SerializeAsString();
  AppendFieldHeader(pb::AllReduceRequest::kTensorFieldNumber, tensor_prefix.size() + data.size(), &prefix);
  prefix += tensor_prefix;
  const grpc::ByteBuffer b = TwoSlices(prefix, grpc::Slice(data));
  pb::AllReduceRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(b)));
  EXPECT_EQ(parsed.SerializeAsString(), whole.SerializeAsString());
}

TEST(WireTest, BadMessagesAreRefusedAndAbsentValuesNeverAskForMemory) {
  const std::string encoded = SampleRequest().SerializeAsString();
  Scratch values;
  pb::AllReduceRequest header;
  // Cut short inside the values.
  EXPECT_EQ(ParseWithBytes(Sliced(encoded.substr(0, encoded.size() - 3), {}), kTensorData,
                           IntoScratch(&values), &header).code(),
            absl::StatusCode::kInvalidArgument);
  // Field number 0 (tag 0x02: field 0, length-delimited).
  EXPECT_EQ(ParseWithBytes(Sliced(std::string("\x02\x01x", 3), {}), kTensorData, IntoScratch(&values), &header)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The destination's refusal is the parse's.
  auto refuse = [](uint64_t) -> absl::StatusOr<char*> { return absl::DataLossError("wrong length"); };
  EXPECT_EQ(ParseWithBytes(Sliced(encoded, {}), kTensorData, refuse, &header).code(),
            absl::StatusCode::kDataLoss);
  // No values field: the destination is not called.
  pb::AllReduceRequest bare = SampleRequest();
  bare.mutable_tensor()->clear_data();
  bool called = false;
  auto note = [&](uint64_t) -> absl::StatusOr<char*> {
    called = true;
    return absl::InternalError("unreachable");
  };
  EXPECT_TRUE(ParseWithBytes(Sliced(bare.SerializeAsString(), {}), kTensorData, note, &header).ok());
  EXPECT_FALSE(called);
  EXPECT_EQ(header.tensor().shape(0), 5);
}

// A values field whose length is past the message's end: the length was read as 32 bits and
// handed to the destination (IntoScratch allocated it), then cast to int for the copy, so ten
// bytes could make the server allocate 4 GiB and copy with a negative length.
TEST(WireTest, ALengthPastTheMessageIsRefusedBeforeAnyMemoryIsAskedFor) {
  uint64_t asked = 0;
  auto note = [&](uint64_t length) -> absl::StatusOr<char*> {
    asked = length;
    return absl::InternalError("unreachable");
  };
  constexpr int kPushData[] = {pb::PushRequest::kDataFieldNumber};
  pb::PushRequest header;
  // Field 6 (data), length-delimited, length 2^32 - 1, then three bytes.
  const std::string huge("\x32\xff\xff\xff\xff\x0f" "abc", 9);
  EXPECT_EQ(ParseWithBytes(Sliced(huge, {2}), kPushData, note, &header).code(),
            absl::StatusCode::kInvalidArgument);
  // Length 2^32 + 3: not 3, whatever its low 32 bits say.
  const std::string wide("\x32\x83\x80\x80\x80\x10" "abc", 9);
  EXPECT_EQ(ParseWithBytes(Sliced(wide, {}), kPushData, note, &header).code(),
            absl::StatusCode::kInvalidArgument);
  // A nested message longer than what remains: no limit is pushed past the end.
  const std::string nested("\x22\xff\xff\xff\xff\x07" "\x22\x01x", 9);
  pb::AllReduceRequest all_reduce;
  EXPECT_EQ(ParseWithBytes(Sliced(nested, {}), kTensorData, note, &all_reduce).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(asked, 0u);
  // The same fields with honest lengths parse.
  Scratch values;
  ASSERT_TRUE(ParseWithBytes(Sliced(std::string("\x32\x03" "abc", 5), {1}), kPushData, IntoScratch(&values),
                             &header).ok());
  EXPECT_EQ(values.view(), "abc");
}

// Found by fuzz/wire_fuzzer: CodedInputStream takes the low 32 bits of a tag or a length of any
// size, so the codec accepted messages that protobuf refuses (a ten-byte tag was taken for field
// 536870896). Tags and lengths are now read as protobuf's parser reads them.
TEST(WireTest, MessagesProtobufRefusesAreRefusedAndThoseItAcceptsAreReadAsItReadsThem) {
  constexpr int kPushData[] = {pb::PushRequest::kDataFieldNumber};
  struct Case {
    const char* what;
    std::string bytes;
    bool valid;
  };
  const Case cases[] = {
      {"a ten-byte tag", std::string("\x08\x01\x80\xff\xff\xff\xff\xff\xff\xff\xff\x01\x07", 13), false},
      {"a skipped field's six-byte length", std::string("\x7a\x83\x80\x80\x80\x80\x00" "abc", 10), false},
      {"a five-byte length of 2^31", std::string("\x7a\x80\x80\x80\x80\x08" "abc", 9), false},
      {"an end-group tag alone", std::string("\x08\x01\x7c", 3), false},
      {"a group ended by another field's tag", std::string("\x7b\x08\x01\x74", 4), false},
      {"an unknown group", std::string("\x7b\x08\x01\x7c\x32\x01x", 7), true},
      {"a two-byte length of 3", std::string("\x32\x83\x00" "abc", 6), true},
      {"a five-byte tag", std::string("\xb2\x80\x80\x80\x00\x01x", 7), true},
  };
  for (const Case& c : cases) {
    pb::PushRequest whole;
    ASSERT_EQ(whole.ParseFromString(c.bytes), c.valid) << c.what;
    Scratch values;
    pb::PushRequest header;
    const absl::Status parsed = ParseWithBytes(Sliced(c.bytes, {1}), kPushData, IntoScratch(&values), &header);
    if (!c.valid) {
      EXPECT_EQ(parsed.code(), absl::StatusCode::kInvalidArgument) << c.what;
      continue;
    }
    ASSERT_TRUE(parsed.ok()) << c.what << ": " << parsed;
    EXPECT_EQ(values.view(), whole.data()) << c.what;
    whole.clear_data();
    EXPECT_EQ(header.SerializeAsString(), whole.SerializeAsString()) << c.what;
  }
}

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

// A server in this process, and clients of it on `plane_`'s transport. The server serves the
// socket data plane unless `data_address_` is emptied first.
class ServerFixture : public ::testing::Test {
 protected:
  void StartServer(int workers, int64_t partition_bytes) {
    server::ServerOptions o;
    o.world_size = workers;
    o.optimizer.learning_rate = 0.5;
    o.partition_bytes = partition_bytes;
    o.barrier_deadline = absl::Seconds(20);
    if (configure_) configure_(o);
    auto s = server::SummaServer::Start("127.0.0.1:0", o, "", security_, "", {}, data_address_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<worker::ParameterClient> Client(int channels, absl::Duration deadline = absl::Seconds(20)) {
    auto client = std::make_unique<worker::ParameterClient>(address_, deadline, absl::Seconds(20), channels,
                                                            ClientSecurity{{}, token_});
    client->set_data_plane(plane_);
    return client;
  }

  pb::ServerStatus Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AttachToken(token_, &ctx);
    pb::ServerStatus status;
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    EXPECT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
    return status;
  }

  std::unique_ptr<server::SummaServer> server_;
  std::string address_;
  std::function<void(server::ServerOptions&)> configure_;  // applied last by StartServer, when set
  std::string data_address_ = "127.0.0.1:0";
  EndpointSecurity security_;
  std::string token_;  // the clients'
  worker::DataPlane plane_ = worker::DataPlane::kGrpc;
};

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
  absl::Status s = zero->PushPull(0, 2, grad.data(), w.data(), &live);
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
  absl::Status refused = zero->PushPull(7, 2, grad.data(), w.data(), &live);
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "reworded OUT_OF_RANGE")) << refused;
  // Rank 1 leaves: rank 0's pushes are stamped with a stale view, refused, refreshed and sent again.
  ASSERT_TRUE(one->Leave(1).ok());
  absl::Status s = zero->PushPull(0, 2, grad.data(), w.data(), &live);
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 8; ++i) expected[i] = float(i) - 0.5f;  // rank 0 alone: 2 over 2 examples, lr 0.5
  EXPECT_EQ(w, expected);
  EXPECT_EQ(Status().stale_view_pushes(), 3u);
}
#endif

// The request buffers the gRPC data path's threads keep between calls are counted in GetStatus;
// the socket plane reads requests into buffers of its own, so over it they stay empty.
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
        absl::Status s = client->PushPull(step, rank + 1, grad.data(), w.data(), nullptr);
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

// Clients on the socket data plane of a daemon, which they find through its gRPC server. The
// plane's tests that need no gRPC server are in socket_plane_test.cc, which the TSan pass runs.
class SocketPlaneTest : public ServerFixture {
 protected:
  SocketPlaneTest() { plane_ = worker::DataPlane::kSocket; }

  absl::Status AllReduceAlone(worker::ParameterClient& client) {
    worker::Collective group;
    group.name = "alone";
    group.group_size = 1;
    std::vector<float> values = {1, 2, 3};
    return client.AllReduceInto(group, values, absl::MakeSpan(values));
  }
};

TEST_F(SocketPlaneTest, RequiredWhereTheServerServesNoneItIsAnErrorAndAutoTakesGrpc) {
  data_address_ = "";
  StartServer(1, 4 << 20);
  EXPECT_EQ(server_->data_port(), 0);
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  const absl::Status refused = AllReduceAlone(*client);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--data_address")) << refused;
  plane_ = worker::DataPlane::kAuto;
  client = Client(1);
  ASSERT_TRUE(AllReduceAlone(*client).ok());
  EXPECT_FALSE(client->on_socket_plane());
  EXPECT_EQ(Status().allreduce_rounds(), 1u);
}

TEST_F(SocketPlaneTest, AutoTakesThePlaneWhereServed) {
  StartServer(1, 4 << 20);
  ASSERT_NE(server_->data_port(), 0);
  plane_ = worker::DataPlane::kAuto;
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  ASSERT_TRUE(AllReduceAlone(*client).ok());
  EXPECT_TRUE(client->on_socket_plane());
}

// The round's own deadline is far off in these two: only the cancellation can let go of the call.
constexpr absl::Duration kFarBarrierDeadline = absl::Minutes(5);

TEST_F(SocketPlaneTest, AClientThatClosesItsConnectionCancelsItsWaitingCall) {
  configure_ = [](server::ServerOptions& o) { o.barrier_deadline = kFarBarrierDeadline; };
  StartServer(1, 4 << 20);
  socket_plane::OwnedFd fd = RawConnect(server_->data_port());
  SendHello(fd.get(), "");
  ASSERT_TRUE(ReadReply(fd.get()).ok());
  SendRequest(fd.get(), kAllReduceMethod, AllReduceMessage("pair", 2, 0, {1, 2}));
  ASSERT_TRUE(Eventually([&] { return Status().parked_calls() == 1; }));
  fd.Reset();
  EXPECT_TRUE(Eventually([&] { return Status().parked_calls() == 0; })) << Status().parked_calls();
}

TEST_F(SocketPlaneTest, ACallPastItsDeadlineEndsAtTheClientAndIsCancelledAtTheServer) {
  configure_ = [](server::ServerOptions& o) { o.barrier_deadline = kFarBarrierDeadline; };
  StartServer(1, 4 << 20);
  std::unique_ptr<worker::ParameterClient> client = Client(1, /*deadline=*/absl::Milliseconds(300));
  worker::Collective group;
  group.name = "pair";
  group.group_size = 2;
  std::vector<float> values = {1, 2, 3};
  const absl::Status s = client->AllReduceInto(group, values, absl::MakeSpan(values));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(Eventually([&] { return Status().parked_calls() == 0; })) << Status().parked_calls();
}

TEST_F(SocketPlaneTest, ShutdownAnswersAWaitingCallAndClosesThePlane) {
  StartServer(1, 4 << 20);
  const int port = server_->data_port();
  absl::Status result;
  std::thread waiting([&] {
    std::unique_ptr<worker::ParameterClient> client = Client(1);
    worker::Collective group;
    group.name = "pair";
    group.group_size = 2;
    std::vector<float> values = {1, 2, 3};
    result = client->AllReduceInto(group, values, absl::MakeSpan(values));
  });
  ASSERT_TRUE(Eventually([&] { return Status().parked_calls() == 1; }));
  server_->Shutdown();
  waiting.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "shutting down")) << result;
  EXPECT_FALSE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(5)).ok());
}

// A fake plane (a listener of the test's own) answers the hello, then a call with `reply`.
absl::Status CallAFakePlane(const std::string& reply) {
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("127.0.0.1:0", &port);
  if (!listener.ok()) return listener.status();
  std::thread fake([&] {
    const int fd = ::accept(listener->get(), nullptr, nullptr);
    if (fd < 0) return;
    socket_plane::OwnedFd conn(fd);
    char hello[socket_plane::kHelloBytes];
    if (!socket_plane::ReadFull(fd, hello, sizeof(hello), absl::Now() + absl::Seconds(10), "hello").ok()) return;
    char ok[socket_plane::kHeaderBytes];
    socket_plane::EncodeReplyHeader({0, 0, 0}, ok);
    SendBytes(fd, std::string(ok, sizeof(ok)));
    char head[socket_plane::kHeaderBytes];
    if (!socket_plane::ReadFull(fd, head, sizeof(head), absl::Now() + absl::Seconds(10), "request").ok()) return;
    std::string body(socket_plane::DecodeRequestHeader(head).length, '\0');
    if (!socket_plane::ReadFull(fd, body.data(), body.size(), absl::Now() + absl::Seconds(10), "body").ok()) return;
    SendBytes(fd, reply);
    char byte;  // until the client closes
    socket_plane::ReadFull(fd, &byte, 1, absl::Now() + absl::Seconds(10), "end").IgnoreError();
  });
  auto calls = std::make_unique<worker::SocketCalls>(std::vector<worker::SocketCalls::Endpoint>{{"127.0.0.1", port}}, "");
  absl::Status result = calls->Open(0, absl::Now() + absl::Seconds(10));
  if (result.ok()) {
    grpc::Slice slice(std::string("request"));
    grpc::ByteBuffer request(&slice, 1), response;
    calls->Start(0, 0, socket_plane::DataMethod::kPull, &request, &response, absl::Now() + absl::Seconds(10));
    size_t tag = 99;
    if (!calls->Next(&tag, &result) || tag != 0) result = absl::InternalError("no call came back");
  }
  calls.reset();  // closes the connection: the fake ends
  fake.join();
  return result;
}

TEST(SocketCallsTest, MalformedRepliesEndTheCallAsDataLoss) {
  char head[socket_plane::kHeaderBytes];
  // An error whose body (its details) is past the limit.
  socket_plane::EncodeReplyHeader(
      {static_cast<uint32_t>(absl::StatusCode::kInternal), 0, socket_plane::kMaxStatusMessageBytes + 1}, head);
  absl::Status s = CallAFakePlane(std::string(head, sizeof(head)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A status message past the limit.
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kInternal),
                                   socket_plane::kMaxStatusMessageBytes + 1, 0}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A well-formed refusal comes through as it is.
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kOutOfRange), 4, 0}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)) + "late");
  EXPECT_EQ(s, absl::OutOfRangeError("late"));
  // ... and one with details keeps its reason, whatever its message says.
  const std::string details = StatusDetails(WithReason(absl::AbortedError("x"), StatusReason::kStaleView));
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kAborted), 4,
                                   static_cast<uint64_t>(details.size())}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)) + "late" + details);
  EXPECT_EQ(s.message(), "late");
  EXPECT_TRUE(IsStaleView(s)) << s;
}

TEST(SocketFrameTest, AListenerOnEveryAddressTakesIpv4AndIpv6) {
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("[::]:0", &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_NE(port, 0);
  EXPECT_TRUE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(10)).ok());
  absl::StatusOr<socket_plane::OwnedFd> bare = socket_plane::Listen(":0", &port);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(socket_plane::Listen("no-port", &port).status().code(), absl::StatusCode::kInvalidArgument);
  // And IPv6, where this machine has an IPv6 loopback (the resolver's wildcard list puts
  // 0.0.0.0, IPv4 alone, first).
  socket_plane::OwnedFd probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 loopback = {};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  if (probe.valid() && ::bind(probe.get(), reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0) {
    absl::StatusOr<socket_plane::OwnedFd> v6 = socket_plane::Connect("::1", port, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(v6.ok()) << v6.status();
  }
}

TEST_F(SocketPlaneTest, TlsAndThePlaneTogetherAreRefusedAtStart) {
  security_.tls.cert = "/nonexistent/cert.pem";
  security_.tls.key = "/nonexistent/key.pem";
  server::ServerOptions o;
  auto s = server::SummaServer::Start("127.0.0.1:0", o, "", security_, "", {}, "127.0.0.1:0");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "plaintext")) << s.status();
}

}  // namespace
}  // namespace summa
