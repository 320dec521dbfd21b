// The raw data path: common/wire.h's codec against protobuf's own encoding, and the worker's
// ParameterClient (raw on both sides) against a real server on 127.0.0.1:0.
#include "common/wire.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "summa/v1/summa.pb.h"
#include "worker/ps_client.h"

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

class RawPathTest : public ::testing::Test {
 protected:
  void StartServer(int workers, int64_t partition_bytes) {
    server::ServerOptions o;
    o.world_size = workers;
    o.optimizer.learning_rate = 0.5;
    o.partition_bytes = partition_bytes;
    o.barrier_deadline = absl::Seconds(20);
    if (configure_) configure_(o);
    auto s = server::SummaServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<worker::ParameterClient> Client(int channels) {
    return std::make_unique<worker::ParameterClient>(address_, absl::Seconds(20), absl::Seconds(20), channels);
  }

  pb::ServerStatus Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::ServerStatus status;
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    EXPECT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
    return status;
  }

  std::unique_ptr<server::SummaServer> server_;
  std::string address_;
  std::function<void(server::ServerOptions&)> configure_;  // applied last by StartServer, when set
};

// Rank 1 leaves; rank 0's client still holds the membership view its Join told it, so its next
// pushes are refused as stale. It asks for the view (Heartbeat) and pushes again, once: the step
// completes without the rank that left, each partition's refusal counted once.
TEST_F(RawPathTest, PushesStampedWithAStaleViewAreRefusedAndTheWorkerRefreshesAndPushesAgain) {
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

TEST_F(RawPathTest, WorkersOverSeveralChannelsTakeExactSyncSteps) {
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
      finals[rank] = w;
    });
  }
  for (auto& t : threads) t.join();
  // Each step: the sum is 3 * (i + 1) over 3 examples, so w[i] -= 0.5 * (i + 1).
  std::vector<float> expected(8);
  for (int i = 0; i < 8; ++i) expected[i] = float(i) - kSteps * 0.5f * float(i + 1);
  for (int rank = 0; rank < kWorkers; ++rank) EXPECT_EQ(finals[rank], expected) << "rank " << rank;
  EXPECT_EQ(server_->core().WeightsForTest(), expected);
}

TEST_F(RawPathTest, ABigTensorIsSummedInChunksInPlace) {
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
  std::vector<std::unique_ptr<server::SummaServer>> shards;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    server::ServerOptions o;
    o.world_size = 2;
    o.shards = 2;
    o.shard = i;
    o.barrier_deadline = absl::Seconds(20);
    auto s = server::SummaServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(s.ok()) << s.status();
    addresses.push_back("127.0.0.1:" + std::to_string((*s)->port()));
    shards.push_back(*std::move(s));
  }
  AllReduceTwoRanksInPlace("halves", (1 << 20) / 4 + 3, [&] {
    return std::make_unique<worker::ParameterClient>(absl::StrJoin(addresses, ","), absl::Seconds(20),
                                                     absl::Seconds(20), /*channels=*/1);
  });
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::ServerStatus status;
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(addresses[i], grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
    EXPECT_EQ(status.allreduce_rounds(), 1u) << "shard " << i;  // one round of its one chunk
  }
}

TEST_F(RawPathTest, GarbageOnTheWireIsInvalidArgumentAndChangesNothing) {
  StartServer(1, 4 << 20);
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  for (const char* method : {"/summa.v1.ParameterServer/Push", "/summa.v1.ParameterServer/PushPull",
                             "/summa.v1.ParameterServer/Pull", "/summa.v1.ParameterServer/AllReduce"}) {
    grpc::Slice garbage(std::string("\x02\x01x\xff", 4));
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
  auto stub = pb::ParameterServer::NewStub(channel);
  grpc::ClientContext ctx;
  pb::ServerStatus status;
  ASSERT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.pushes_served(), 0u);
  EXPECT_FALSE(status.model_defined());
}

}  // namespace
}  // namespace summa
