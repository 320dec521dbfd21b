// SparseCalls (client/sparse_calls.h): the embedding tables' calls against in-memory shards (a
// DataTransport that answers at once), then ParameterClient's over gRPC against two small fake
// shards: ids deduplicated and split by RowShard, the request bytes, rows scattered back,
// duplicates' gradients summed, sync mode's empty pushes, ALREADY_EXISTS, the transport's life.
#include "client/sparse_calls.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "common/row_hash.h"
#include "common/rpc/wire.h"
#include "gtest/gtest.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::worker {
namespace {

namespace pb = ::summa::v1;

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::vector<uint64_t> IdsOf(const std::string& bytes, size_t count) {
  std::vector<uint64_t> ids(count);
  if (count > 0) std::memcpy(ids.data(), bytes.data(), count * sizeof(uint64_t));  // never from null
  return ids;
}

// Row `id` of table `table`: distinct per table, id and column.
float RowValue(uint32_t table, uint64_t id, int k) { return static_cast<float>(table * 100000 + (id % 10000) * 10 + k); }

// The shards' side, in memory: every request recorded as protobuf parses it whole (so the
// encoding is plain protobuf), pulls answered with RowValue, pushes with `completed`, and a
// status per shard to answer instead where set.
struct FakeShards {
  struct Pull {
    int shard;
    pb::SparsePullRequest request;
  };
  struct Push {
    int shard;
    pb::SparsePushRequest request;
  };
  int dim = 4;
  uint64_t version_base = 10;  // shard s answers version_base + s
  bool completed = true;
  std::map<int, absl::Status> refuse;  // shard -> what it answers instead
  std::vector<Pull> pulls;
  std::vector<Push> pushes;
  int transports = 0;  // made so far

  absl::Status Serve(int shard, DataMethod method, const grpc::ByteBuffer& request, grpc::ByteBuffer* reply) {
    const std::string bytes = Bytes(request);
    if (method == DataMethod::kSparsePull) {
      pb::SparsePullRequest r;
      if (!r.ParseFromString(bytes)) return absl::InvalidArgumentError("not a SparsePullRequest");
      pulls.push_back({shard, r});
      if (auto it = refuse.find(shard); it != refuse.end()) return it->second;
      pb::SparsePullResponse answer;
      answer.set_table(r.table());
      answer.set_version(version_base + shard);
      const size_t count = r.ids().size() / sizeof(uint64_t);
      std::vector<float> rows;
      for (uint64_t id : IdsOf(r.ids(), count)) {
        for (int k = 0; k < dim; ++k) rows.push_back(RowValue(r.table(), id, k));
      }
      answer.set_rows(rows.data(), rows.size() * sizeof(float));
      *reply = Encode(answer);
      return absl::OkStatus();
    }
    if (method == DataMethod::kSparsePush) {
      pb::SparsePushRequest r;
      if (!r.ParseFromString(bytes)) return absl::InvalidArgumentError("not a SparsePushRequest");
      pushes.push_back({shard, r});
      if (auto it = refuse.find(shard); it != refuse.end()) return it->second;
      pb::SparsePushResponse answer;
      answer.set_completed_step(completed);
      answer.set_version(r.step() + 1);
      *reply = Encode(answer);
      return absl::OkStatus();
    }
    return absl::UnimplementedError("not a sparse method");
  }
};

// A DataTransport whose calls end as they start, answered by FakeShards.
class InstantTransport final : public DataTransport {
 public:
  explicit InstantTransport(FakeShards* shards) : shards_(shards) {}
  void Start(size_t tag, int shard, DataMethod method, const grpc::ByteBuffer* request, grpc::ByteBuffer* reply,
             absl::Time deadline) override {
    ended_.emplace_back(tag, shards_->Serve(shard, method, *request, reply));
  }
  bool Next(size_t* tag, absl::Status* status) override {
    if (ended_.empty()) return false;
    std::tie(*tag, *status) = ended_.front();
    ended_.pop_front();
    return true;
  }
  void Wake() override {}
  bool socket_plane() const override { return false; }
  bool lost() const override { return lost_; }
  bool lost_ = false;

 private:
  FakeShards* const shards_;  // Not owned.
  std::deque<std::pair<size_t, absl::Status>> ended_;
};

pb::EmbeddingTableSpec Table(const std::string& name, int dim) {
  pb::EmbeddingTableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  return t;
}

class SparseCallsTest : public ::testing::Test {
 protected:
  static constexpr int kShards = 3;
  static constexpr int kDim = 4;

  SparseCallsTest()
      : calls_(kShards, [this](std::unique_ptr<DataTransport>* t) {
          if (*t == nullptr) {
            auto made = std::make_unique<InstantTransport>(&shards_);
            last_ = made.get();
            *t = std::move(made);
            ++shards_.transports;
          }
          return absl::OkStatus();
        }) {
    shards_.dim = kDim;
    calls_.set_tables({Table("users", kDim), Table("items", kDim)});
  }

  void Join(pb::Mode mode) {
    SparseCalls::Member m;
    m.rank = 1;
    m.sessions = {100, 101, 102};
    m.mode = mode;
    calls_.SetMember(std::move(m));
  }

  // Ids with duplicates over every shard.
  static std::vector<uint64_t> Batch() {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 60; ++i) ids.push_back((i * 37) % 23 + 1000);
    return ids;
  }
  // `n` distinct ids that shard `shard` holds.
  static std::vector<uint64_t> HeldBy(int shard, size_t n) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 1; ids.size() < n; ++id) {
      if (RowShard(id, kShards) == shard) ids.push_back(id);
    }
    return ids;
  }

  FakeShards shards_;
  InstantTransport* last_ = nullptr;
  SparseCalls calls_;
};

TEST_F(SparseCallsTest, CallsBeforeJoinAndUnknownTablesAreRefused) {
  std::vector<float> rows(kDim);
  const uint64_t id = 1;
  absl::StatusOr<uint64_t> pulled = calls_.Pull(0, 0, {&id, 1}, rows.data());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kFailedPrecondition) << pulled.status();
  absl::StatusOr<bool> pushed = calls_.Push(0, 0, 1, {&id, 1}, rows.data());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition) << pushed.status();
  Join(pb::MODE_SYNC);
  pulled = calls_.Pull(2, 0, {&id, 1}, rows.data());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kInvalidArgument) << pulled.status();
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "table 2")) << pulled.status();
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "declares 2 tables")) << pulled.status();
  pushed = calls_.Push(7, 0, 1, {&id, 1}, rows.data());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument) << pushed.status();
  EXPECT_EQ(calls_.TableDim(1).value_or(-1), kDim);
  EXPECT_EQ(calls_.TableDim(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(shards_.pulls.empty() && shards_.pushes.empty());
}

TEST_F(SparseCallsTest, APullAsksEachShardForItsDistinctIdsOnceAndScattersTheRowsBack) {
  Join(pb::MODE_SYNC);
  const std::vector<uint64_t> ids = Batch();
  std::vector<float> rows(ids.size() * kDim, -1);
  absl::StatusOr<uint64_t> version = calls_.Pull(1, 7, ids, rows.data());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, shards_.version_base);  // the lowest answered (shard 0's)
  ASSERT_EQ(shards_.pulls.size(), static_cast<size_t>(kShards));
  std::multiset<uint64_t> asked;
  for (const FakeShards::Pull& p : shards_.pulls) {
    EXPECT_EQ(p.request.rank(), 1);
    EXPECT_EQ(p.request.session(), 100u + p.shard);
    EXPECT_EQ(p.request.table(), 1u);
    EXPECT_EQ(p.request.min_version(), 7u);
    ASSERT_EQ(p.request.ids().size() % sizeof(uint64_t), 0u);
    for (uint64_t id : IdsOf(p.request.ids(), p.request.ids().size() / sizeof(uint64_t))) {
      EXPECT_EQ(RowShard(id, kShards), p.shard) << "id " << id;
      asked.insert(id);
    }
  }
  const std::set<uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(asked.size(), distinct.size());  // no id twice
  EXPECT_EQ(std::set<uint64_t>(asked.begin(), asked.end()), distinct);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) ASSERT_EQ(rows[i * kDim + k], RowValue(1, ids[i], k)) << "position " << i;
  }
}

TEST_F(SparseCallsTest, APullCallsOnlyTheShardsHoldingItsIds) {
  Join(pb::MODE_SYNC);
  // Distinct ids of one shard: the rows come straight into the caller's buffer.
  const std::vector<uint64_t> ids = HeldBy(2, 9);
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(calls_.Pull(0, 0, ids, rows.data()).ok());
  ASSERT_EQ(shards_.pulls.size(), 1u);
  EXPECT_EQ(shards_.pulls[0].shard, 2);
  EXPECT_EQ(IdsOf(shards_.pulls[0].request.ids(), ids.size()), ids);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(rows[i * kDim + 3], RowValue(0, ids[i], 3));
  // No ids: a wait for the version on every shard, asking no rows (the lowest version answered).
  absl::StatusOr<uint64_t> waited = calls_.Pull(0, 42, {}, rows.data());
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, shards_.version_base);
  ASSERT_EQ(shards_.pulls.size(), 1u + kShards);
  for (int s = 0; s < kShards; ++s) {
    EXPECT_EQ(shards_.pulls[1 + s].shard, s);
    EXPECT_EQ(shards_.pulls[1 + s].request.min_version(), 42u);
    EXPECT_TRUE(shards_.pulls[1 + s].request.ids().empty());
  }
}

TEST_F(SparseCallsTest, AShardsRefusalIsTheCallsErrorNamingTableAndShard) {
  Join(pb::MODE_SYNC);
  shards_.refuse[1] = absl::UnavailableError("shard going down");
  const std::vector<uint64_t> ids = Batch();
  std::vector<float> rows(ids.size() * kDim);
  absl::StatusOr<uint64_t> pulled = calls_.Pull(0, 0, ids, rows.data());
  ASSERT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable) << pulled.status();
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "SparsePull of table 0 ('users') on shard 1"))
      << pulled.status();
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "shard going down")) << pulled.status();
  EXPECT_EQ(shards_.pulls.size(), static_cast<size_t>(kShards));  // every shard was asked
}

TEST_F(SparseCallsTest, RowsOfAnotherLengthThanTheTablesAreDataLossNamingTheShard) {
  Join(pb::MODE_SYNC);
  shards_.dim = kDim - 1;
  const std::vector<uint64_t> ids = HeldBy(0, 3);
  std::vector<float> rows(ids.size() * kDim);
  absl::StatusOr<uint64_t> pulled = calls_.Pull(1, 0, ids, rows.data());
  ASSERT_EQ(pulled.status().code(), absl::StatusCode::kDataLoss) << pulled.status();
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "SparsePull of table 1 ('items') on shard 0: 36 bytes of "
                                                           "rows, expected 48"))
      << pulled.status();
}

TEST_F(SparseCallsTest, APushSumsDuplicatesAndSendsIdsThenGradients) {
  Join(pb::MODE_ASYNC);
  const std::vector<uint64_t> ids = Batch();
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 13) * 0.5f;
  absl::StatusOr<bool> pushed = calls_.Push(0, 5, 32, ids, grads.data());
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(*pushed);
  // What each id's row should be: its positions' gradients summed, in position order.
  std::map<uint64_t, std::vector<float>> want;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, first] = want.try_emplace(ids[i], grads.begin() + i * kDim, grads.begin() + (i + 1) * kDim);
    if (!first) {
      for (int k = 0; k < kDim; ++k) it->second[k] += grads[i * kDim + k];
    }
  }
  std::set<uint64_t> sent;
  ASSERT_EQ(shards_.pushes.size(), static_cast<size_t>(kShards));  // each holds some of the batch
  for (const FakeShards::Push& p : shards_.pushes) {
    const pb::SparsePushRequest& r = p.request;
    EXPECT_EQ(r.rank(), 1);
    EXPECT_EQ(r.session(), 100u + p.shard);
    EXPECT_EQ(r.table(), 0u);
    EXPECT_EQ(r.step(), 5u);
    EXPECT_EQ(r.num_examples(), 32);  // unchanged on every shard
    ASSERT_GT(r.count(), 0u);
    ASSERT_EQ(r.data().size(), r.count() * (sizeof(uint64_t) + kDim * sizeof(float)));
    const std::vector<uint64_t> shard_ids = IdsOf(r.data(), r.count());
    for (size_t j = 0; j < shard_ids.size(); ++j) {
      EXPECT_EQ(RowShard(shard_ids[j], kShards), p.shard);
      EXPECT_TRUE(sent.insert(shard_ids[j]).second) << "id " << shard_ids[j] << " sent twice";
      std::vector<float> row(kDim);
      std::memcpy(row.data(), r.data().data() + r.count() * sizeof(uint64_t) + j * kDim * sizeof(float),
                  kDim * sizeof(float));
      EXPECT_EQ(row, want[shard_ids[j]]) << "id " << shard_ids[j];
    }
  }
  EXPECT_EQ(sent.size(), want.size());
}

TEST_F(SparseCallsTest, InSyncModeEveryShardGetsAPushEmptyWhereItHoldsNone) {
  const std::vector<uint64_t> ids = HeldBy(1, 4);
  std::vector<float> grads(ids.size() * kDim, 1.5f);
  Join(pb::MODE_SYNC);
  ASSERT_TRUE(calls_.Push(1, 3, 8, ids, grads.data()).ok());
  ASSERT_EQ(shards_.pushes.size(), static_cast<size_t>(kShards));
  for (const FakeShards::Push& p : shards_.pushes) {
    EXPECT_EQ(p.request.step(), 3u);
    EXPECT_EQ(p.request.num_examples(), 8);
    EXPECT_EQ(p.request.session(), 100u + p.shard);
    if (p.shard == 1) {
      EXPECT_EQ(p.request.count(), ids.size());
      // One shard, no id twice: ids and gradients went as the caller's own bytes.
      EXPECT_EQ(IdsOf(p.request.data(), ids.size()), ids);
      EXPECT_EQ(0, std::memcmp(p.request.data().data() + ids.size() * sizeof(uint64_t), grads.data(),
                               grads.size() * sizeof(float)));
    } else {
      EXPECT_EQ(p.request.count(), 0u);
      EXPECT_TRUE(p.request.data().empty());
    }
  }
  // No ids at all: still a push to every shard.
  shards_.pushes.clear();
  ASSERT_TRUE(calls_.Push(1, 4, 0, {}, nullptr).ok());
  EXPECT_EQ(shards_.pushes.size(), static_cast<size_t>(kShards));

  // Async and SSP: only the shards holding some of the ids.
  for (pb::Mode mode : {pb::MODE_ASYNC, pb::MODE_SSP}) {
    Join(mode);
    shards_.pushes.clear();
    ASSERT_TRUE(calls_.Push(1, 3, 8, ids, grads.data()).ok());
    ASSERT_EQ(shards_.pushes.size(), 1u) << pb::Mode_Name(mode);
    EXPECT_EQ(shards_.pushes[0].shard, 1);
    shards_.pushes.clear();
    EXPECT_TRUE(calls_.Push(1, 4, 0, {}, nullptr).value_or(false));
    EXPECT_TRUE(shards_.pushes.empty());
  }
}

TEST_F(SparseCallsTest, APushCountedAlreadyIsDoneAndCompletedOnlyWhenEveryShardSaysSo) {
  Join(pb::MODE_SYNC);
  const std::vector<uint64_t> ids = Batch();
  std::vector<float> grads(ids.size() * kDim, 1);
  EXPECT_TRUE(calls_.Push(0, 0, 1, ids, grads.data()).value_or(false));
  shards_.completed = false;
  absl::StatusOr<bool> pushed = calls_.Push(0, 1, 1, ids, grads.data());
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(*pushed);
  shards_.completed = true;
  shards_.refuse[2] = absl::AlreadyExistsError("rank 1 already pushed table 0 for step 2");
  pushed = calls_.Push(0, 2, 1, ids, grads.data());
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(*pushed);  // shard 2 counted it before: whether that completed the step is unknown
  shards_.refuse[2] = absl::FailedPreconditionError("step 3 is finished");
  pushed = calls_.Push(0, 3, 1, ids, grads.data());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(pushed.status().message(), "SparsePush of table 0 ('users') on shard 2"))
      << pushed.status();
}

TEST_F(SparseCallsTest, TheTransportIsKeptAcrossCallsAndMadeAnewAfterAJoinOrALostPlane) {
  Join(pb::MODE_SYNC);
  const std::vector<uint64_t> ids = Batch();
  std::vector<float> rows(ids.size() * kDim);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(calls_.Pull(0, 0, ids, rows.data()).ok());
  EXPECT_EQ(shards_.transports, 1);
  Join(pb::MODE_SYNC);
  ASSERT_TRUE(calls_.Pull(0, 0, ids, rows.data()).ok());
  EXPECT_EQ(shards_.transports, 2);
  last_->lost_ = true;
  ASSERT_TRUE(calls_.Pull(0, 0, ids, rows.data()).ok());
  ASSERT_TRUE(calls_.Pull(0, 0, ids, rows.data()).ok());
  EXPECT_EQ(shards_.transports, 3);
  // Left (or a Join under way): refused until the next Join.
  calls_.SetMember({});
  EXPECT_EQ(calls_.Pull(0, 0, ids, rows.data()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SparseCallsTest, CallsFromSeveralThreadsTakeTurns) {
  Join(pb::MODE_ASYNC);
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < 50; ++i) ids.push_back((i * (t + 3)) % 41);
      std::vector<float> rows(ids.size() * kDim);
      for (int round = 0; round < 50; ++round) {
        const uint32_t table = (t + round) % 2;
        if (!calls_.Pull(table, 0, ids, rows.data()).ok()) ++wrong[t];
        for (size_t i = 0; i < ids.size(); ++i) wrong[t] += rows[i * kDim + 1] != RowValue(table, ids[i], 1);
        if (!calls_.Push(table, round, 1, ids, rows.data()).ok()) ++wrong[t];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

// ParameterClient over gRPC against fake shards that serve Join and the sparse calls (and no
// socket plane: DataPlane is unimplemented, so the data path takes gRPC).
class FakeShardService final : public pb::ParameterServer::Service {
 public:
  FakeShardService(int shard, int shards) : shard_(shard), shards_(shards) {}

  grpc::Status Join(grpc::ServerContext*, const pb::JoinRequest* request, pb::JoinResponse* response) override {
    absl::MutexLock lock(&mu_);
    joins_.push_back(*request);
    response->set_rank(0);
    response->set_session(500 + shard_);
    response->set_shard(shard_);
    response->set_shards(shards_);
    response->set_mode(pb::MODE_SYNC);
    if (shard_ == 0) {  // the whole (4-float) model on shard 0
      pb::Partition* p = response->add_partitions();
      p->set_id(0);
      p->set_offset(0);
      p->set_length(4);
    }
    return grpc::Status::OK;
  }
  grpc::Status SparsePull(grpc::ServerContext*, const pb::SparsePullRequest* request,
                          pb::SparsePullResponse* response) override {
    absl::MutexLock lock(&mu_);
    pulls_.push_back(*request);
    std::vector<float> rows;
    const size_t count = request->ids().size() / sizeof(uint64_t);
    for (uint64_t id : IdsOf(request->ids(), count)) {
      if (RowShard(id, shards_) != shard_) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not my row");
      for (int k = 0; k < 2; ++k) rows.push_back(RowValue(request->table(), id, k));
    }
    response->set_table(request->table());
    response->set_version(3);
    response->set_rows(rows.data(), rows.size() * sizeof(float));
    return grpc::Status::OK;
  }
  grpc::Status SparsePush(grpc::ServerContext*, const pb::SparsePushRequest* request,
                          pb::SparsePushResponse* response) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back(*request);
    response->set_completed_step(true);
    return grpc::Status::OK;
  }

  std::vector<pb::JoinRequest> joins() {
    absl::MutexLock lock(&mu_);
    return joins_;
  }
  std::vector<pb::SparsePullRequest> pulls() {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }
  std::vector<pb::SparsePushRequest> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }

 private:
  const int shard_;
  const int shards_;
  absl::Mutex mu_;
  std::vector<pb::JoinRequest> joins_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::SparsePullRequest> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::SparsePushRequest> pushes_ ABSL_GUARDED_BY(mu_);
};

TEST(ParameterClientSparseTest, JoinDeclaresTheTablesAndRowsTravelOverGrpcToEachShard) {
  constexpr int kShards = 2;
  std::vector<std::unique_ptr<FakeShardService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < kShards; ++s) {
    services.push_back(std::make_unique<FakeShardService>(s, kShards));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(services.back().get());
    servers.push_back(builder.BuildAndStart());
    ASSERT_GT(port, 0);
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  }
  ParameterClient client(addresses[0] + "," + addresses[1], absl::Seconds(10), absl::Seconds(10));
  pb::EmbeddingTableSpec table = Table("users", 2);
  table.mutable_optimizer()->set_name("adagrad");
  client.set_tables({table});
  const std::vector<uint64_t> ids = {1, 2, 3, 2, 1, 9, 10, 11};
  std::vector<float> rows(ids.size() * 2);
  EXPECT_EQ(client.SparsePull(0, 0, ids, rows.data()).status().code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<JoinInfo> joined = client.Join(0, 1, {TensorSpec{"w", DType::kFloat32, {4}}}, nullptr, "");
  ASSERT_TRUE(joined.ok()) << joined.status();
  for (int s = 0; s < kShards; ++s) {
    const std::vector<pb::JoinRequest> joins = services[s]->joins();
    ASSERT_EQ(joins.size(), 1u);
    ASSERT_EQ(joins[0].tables_size(), 1);
    EXPECT_EQ(joins[0].tables(0).SerializeAsString(), table.SerializeAsString());
  }

  // From another thread than the one that joined, as Python's prefetch does.
  absl::StatusOr<uint64_t> version;
  absl::StatusOr<bool> pushed;
  std::thread([&] {
    version = client.SparsePull(0, 1, ids, rows.data());
    pushed = client.SparsePush(0, 0, 8, ids, rows.data());
  }).join();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 3u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(rows[i * 2], RowValue(0, ids[i], 0));
    EXPECT_EQ(rows[i * 2 + 1], RowValue(0, ids[i], 1));
  }
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(*pushed);
  size_t pulled = 0;
  for (int s = 0; s < kShards; ++s) {
    for (const pb::SparsePullRequest& p : services[s]->pulls()) {
      EXPECT_EQ(p.session(), 500u + s);
      EXPECT_EQ(p.min_version(), 1u);
      pulled += p.ids().size() / sizeof(uint64_t);
    }
    // Sync mode: one push to each shard, with that shard's session.
    const std::vector<pb::SparsePushRequest> pushes = services[s]->pushes();
    ASSERT_EQ(pushes.size(), 1u) << "shard " << s;
    EXPECT_EQ(pushes[0].session(), 500u + s);
    EXPECT_EQ(pushes[0].num_examples(), 8);
  }
  EXPECT_EQ(pulled, 6u);  // the distinct ids
  EXPECT_EQ(client.SparsePull(1, 0, ids, rows.data()).status().code(), absl::StatusCode::kInvalidArgument);
  for (auto& server : servers) server->Shutdown();
}

}  // namespace
}  // namespace summa::worker
