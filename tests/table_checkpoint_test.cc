// The embedding tables in checkpoints (server/core/parameter_server_checkpoint.cc, the codec's
// DecodeTables, the file's table records): a sync job of two ranks pulling and pushing rows comes
// back from its checkpoint with every row, its optimizer slots, the tables' versions and counters
// bit for bit, and goes on as if it had never stopped; on 2 shards from 1 and on 1 from 2 too. A
// sync checkpoint is taken only while every table is at the partitions' version; async tables
// keep their own. A shard's rollback takes its tables back. A torn or corrupt table record is
// DATA_LOSS; a checkpoint without tables still restores.
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/row_hash.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/checkpoint/checkpoint_file.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/parameter_server.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

// Table 0 "items": adagrad rows of 4; table 1 "users": lazy Adam rows of 3, admitted on their
// second pull and expired after 3 steps untouched; table 2 "many": sgd rows of 2, kMany of them
// (more than two chunks of a checkpoint).
constexpr int kTables = 3;
constexpr uint64_t kItems = 60, kUsers = 40, kMany = 140000;
constexpr uint64_t kUniverse[kTables] = {kItems, kUsers, kMany};

std::vector<pb::EmbeddingTableSpec> Tables() {
  std::vector<pb::EmbeddingTableSpec> tables(kTables);
  pb::EmbeddingTableSpec& items = tables[0];
  items.set_name("items");
  items.set_dim(4);
  items.mutable_initializer()->set_kind("uniform");
  items.mutable_initializer()->set_a(-0.5);
  items.mutable_initializer()->set_b(0.5);
  items.mutable_initializer()->set_seed(7);
  items.mutable_optimizer()->set_name("adagrad");
  items.mutable_optimizer()->set_learning_rate(0.5);
  items.mutable_optimizer()->set_initial_accumulator_value(0.1);
  pb::EmbeddingTableSpec& users = tables[1];
  users.set_name("users");
  users.set_dim(3);
  users.mutable_initializer()->set_kind("normal");
  users.mutable_initializer()->set_b(0.1);
  users.mutable_optimizer()->set_name("adam");
  users.mutable_optimizer()->set_learning_rate(0.05);
  users.set_admit_after(2);
  users.set_expire_after(1);  // rows of step 0 untouched in step 1 go at version 2: before the checkpoint
  pb::EmbeddingTableSpec& many = tables[2];
  many.set_name("many");
  many.set_dim(2);
  many.mutable_initializer()->set_kind("uniform");
  many.mutable_initializer()->set_a(-1);
  many.mutable_initializer()->set_b(1);
  many.mutable_optimizer()->set_name("sgd");
  many.mutable_optimizer()->set_learning_rate(0.25);
  return tables;
}

// The ids rank `rank` pulls and pushes of table `t` at step `step` (duplicates included): the
// same whatever the shard count. At step 0 rank 0 reads every row of "many".
std::vector<uint64_t> Ids(int t, uint64_t step, int rank, bool pull) {
  std::vector<uint64_t> ids;
  if (t == 2 && step == 0 && rank == 0 && pull) {
    for (uint64_t id = 0; id < kMany; ++id) ids.push_back(id);
    return ids;
  }
  for (uint64_t k = 0; k < 8; ++k) {
    if (t == 0) ids.push_back((step * 5 + rank * 11 + k * 7) % kItems);
    if (t == 1 && k < 6) ids.push_back((step * 3 + rank * 5 + k * 3) % kUsers);
    if (t == 2) ids.push_back((step * 1000 + rank * 17 + k * 9973) % kMany);
  }
  ids.push_back(ids.front());
  return ids;
}

struct Shard {
  std::unique_ptr<ParameterServer> server;
  std::vector<PartitionRange> held;
};
using Job = std::vector<Shard>;

class TableCheckpointTest : public ::testing::Test {
 protected:
  TableCheckpointTest() {
    root_ = std::filesystem::temp_directory_path() /
            ("summa-table-ckpt-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  ~TableCheckpointTest() override { std::filesystem::remove_all(root_); }

  ServerOptions Options(int shard, int shards, const std::string& dir, Mode mode, int64_t every) {
    ServerOptions o;
    o.require_sessions = false;
    o.world_size = 2;
    o.mode = mode;
    o.optimizer.name = "adam";
    o.optimizer.learning_rate = 0.01;
    o.partition_bytes = 16;
    o.shard = shard;
    o.shards = shards;
    o.checkpoint_dir = dir;
    o.checkpoint_every = every;
    o.clock = &clock_;
    return o;
  }

  // `shards` shards with `dir` as the job's checkpoint directory, none joined yet.
  Job Make(int shards, const std::string& dir, Mode mode = Mode::kSync, int64_t every = 0) {
    Job job;
    for (int i = 0; i < shards; ++i) {
      job.push_back({std::make_unique<ParameterServer>(Options(i, shards, dir, mode, every)), {}});
    }
    return job;
  }

  // Both ranks join every shard declaring `tables`, rank 0 with the initial values when `with_values`.
  void JoinAll(Job& job, bool with_values, const std::vector<pb::EmbeddingTableSpec>& tables = Tables()) {
    std::vector<float> w(20), b = {0.5f, -0.25f, 0.125f};
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i) - 0.4f;
    const std::string w_bytes = Bytes(w), b_bytes = Bytes(b);
    for (Shard& shard : job) {
      for (int rank : {0, 1}) {
        const bool values = with_values && rank == 0;
        JoinRequestView v;
        v.rank = rank;
        v.world_size = 2;
        v.params = {{{"w", DType::kFloat32, {4, 5}}, values ? absl::string_view(w_bytes) : absl::string_view()},
                    {{"b", DType::kFloat32, {3}}, values ? absl::string_view(b_bytes) : absl::string_view()}};
        v.tables = tables;
        absl::StatusOr<JoinResult> joined = shard.server->Join(v);
        ASSERT_TRUE(joined.ok()) << joined.status();
        shard.held = joined->partitions;
      }
    }
  }

  // Both ranks read their rows of step `step` (at version `step`) and push their gradients to
  // every shard, an empty push to a shard holding none of them: a table's step needs every rank.
  void PushRows(Job& job, uint64_t step, int only_rank = -1) {
    const int shards = static_cast<int>(job.size());
    for (int rank : {0, 1}) {
      if (only_rank >= 0 && rank != only_rank) continue;
      for (int t = 0; t < kTables; ++t) {
        const int dim = Tables()[t].dim();
        std::vector<std::vector<uint64_t>> pulls(shards), pushes(shards);
        for (uint64_t id : Ids(t, step, rank, /*pull=*/true)) pulls[RowShard(id, shards)].push_back(id);
        for (uint64_t id : Ids(t, step, rank, /*pull=*/false)) pushes[RowShard(id, shards)].push_back(id);
        for (int s = 0; s < shards; ++s) {
          if (!pulls[s].empty()) {
            SparsePullView v;
            v.rank = rank;
            v.table = t;
            v.min_version = job[s].server->options().mode == Mode::kSync ? step : 0;
            v.ids = pulls[s];
            auto call = std::make_shared<FakeCall>();
            job[s].server->SparsePull(std::move(v), call);
            ASSERT_TRUE(call->Wait().ok());
          }
          std::vector<float> grads;
          for (uint64_t id : pushes[s]) {
            for (int j = 0; j < dim; ++j) {
              grads.push_back(std::sin(0.37f * static_cast<float>((step + 1) * (rank + 2)) +
                                       0.011f * static_cast<float>(id) + 0.05f * static_cast<float>(j)));
            }
          }
          SparsePushView v;
          v.rank = rank;
          v.table = t;
          v.step = step;
          v.num_examples = 1 + rank;
          v.ids = pushes[s];
          v.grads = grads;
          absl::StatusOr<bool> pushed = job[s].server->SparsePush(v);
          ASSERT_TRUE(pushed.ok()) << pushed.status();
        }
      }
    }
  }

  // Both ranks' dense gradients of step `step` to every partition of every shard.
  void PushDense(Job& job, uint64_t step) {
    for (Shard& shard : job) PushBothRanks(*shard.server, shard.held, step);
  }

  // A whole step: the rows first, as a worker pushes them, then the dense gradients.
  void Step(Job& job, uint64_t step) {
    PushRows(job, step);
    PushDense(job, step);
  }

  static const EmbeddingTable& TableOf(const Job& job, int t, uint64_t id) {
    return **job[RowShard(id, static_cast<int>(job.size()))].server->Table(t);
  }

  // Every row of `got` and `want` (any shard counts), its values and optimizer slots bit for bit,
  // the tables' versions on every shard, and their counters summed over the shards.
  static void ExpectSameTables(const Job& got, const Job& want) {
    const std::vector<pb::EmbeddingTableSpec> specs = Tables();
    for (int t = 0; t < kTables; ++t) {
      SCOPED_TRACE(specs[t].name());
      const int slots = static_cast<int>(TableOf(want, t, 0).slot_names().size());
      uint64_t held = 0, differ = 0, first = 0;
      for (uint64_t id = 0; id < kUniverse[t]; ++id) {
        const std::vector<float> row = TableOf(want, t, id).RowForTest(id);
        bool same = TableOf(got, t, id).RowForTest(id) == row;
        for (int k = 0; k < slots; ++k) {
          same = same && TableOf(got, t, id).SlotForTest(id, k) == TableOf(want, t, id).SlotForTest(id, k);
        }
        held += !row.empty();
        if (!same && differ++ == 0) first = id;
      }
      EXPECT_GT(held, 0u);
      EXPECT_EQ(differ, 0u) << "rows (or their optimizer slots) differ, the first of id " << first;
      auto sum = [&](const Job& job) {
        TableCounters c;
        for (const Shard& shard : job) {
          const TableCounters s = (*shard.server->Table(t))->Counters();
          EXPECT_EQ(s.version, (*want[0].server->Table(t))->version());
          c.rows += s.rows;
          c.rows_created += s.rows_created;
          c.rows_expired += s.rows_expired;
          c.rows_waiting_admission += s.rows_waiting_admission;
          c.dropped_gradients += s.dropped_gradients;
        }
        return c;
      };
      const TableCounters g = sum(got), w = sum(want);
      EXPECT_EQ(g.rows, w.rows);
      EXPECT_EQ(g.rows, static_cast<int64_t>(held));
      EXPECT_EQ(g.rows_created, w.rows_created);
      EXPECT_EQ(g.rows_expired, w.rows_expired);
      EXPECT_EQ(g.rows_waiting_admission, w.rows_waiting_admission);
      EXPECT_EQ(g.dropped_gradients, w.dropped_gradients);
    }
  }

  static std::vector<float> Weights(const Job& job) {
    std::vector<const ParameterServer*> shards;
    for (const Shard& shard : job) shards.push_back(shard.server.get());
    return ParameterServerPeer::JobWeights(shards);
  }

  // What the daemon restores at start into each shard of `job` (server/daemon.cc); `from_shards`:
  // what each restore should report (0: its own checkpoint).
  static void RestoreAtStart(Job& job, int from_shards) {
    for (Shard& shard : job) {
      ParameterServer& ps = *shard.server;
      const ServerOptions& o = ps.options();
      std::vector<std::string> warnings;
      absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestForShard(
          o.checkpoint_dir, o.shard, o.shards, [&](CheckpointReader& r) { return ps.Restore(r.header(), r); },
          [&](absl::Span<CheckpointReader* const> readers) {
            std::vector<ParameterServer::ShardCheckpoint> set;
            for (CheckpointReader* r : readers) set.push_back({&r->header(), r});
            return ps.RestoreResharded(set);
          },
          &warnings);
      ASSERT_TRUE(restored.ok()) << restored.status();
      ASSERT_TRUE(restored->has_value());
      EXPECT_EQ((*restored)->from_shards, from_shards);
      EXPECT_TRUE(warnings.empty()) << warnings[0];
    }
  }

  // The file `dir` holds of `version`, restored into a fresh server of one shard: its status.
  absl::Status RestoreFile(const std::string& path) {
    ParameterServer ps(Options(0, 1, "", Mode::kSync, 0));
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    if (!reader.ok()) return reader.status();
    absl::Status s = ps.Restore((*reader)->header(), **reader);
    EXPECT_EQ(ps.Status().model_defined, s.ok());
    return s;
  }

  std::string root_;
  FakeClock clock_;
};

// Every record of the checkpoint at `path` (its header, partitions and table records in order).
struct Records {
  pb::Checkpoint header;
  std::vector<pb::PartitionCheckpoint> partitions;
  std::vector<pb::TableRecord> tables;
};

absl::StatusOr<Records> ReadRecords(const std::string& path) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  Records r;
  r.header = reader->header();
  pb::PartitionCheckpoint p;
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, reader->Next(&p));
    if (!more) break;
    r.partitions.push_back(p);
  }
  pb::TableRecord t;
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, reader->NextTable(&t));
    if (!more) break;
    r.tables.push_back(t);
  }
  return r;
}

// `r` written as a whole checkpoint file into `dir` (the writer's integrity checks and all).
absl::StatusOr<std::string> WriteRecords(const std::string& dir, const Records& r) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer, CheckpointWriter::Create(dir, r.header));
  for (const pb::PartitionCheckpoint& p : r.partitions) SUMMA_RETURN_IF_ERROR(writer->Append(p));
  for (const pb::TableRecord& t : r.tables) SUMMA_RETURN_IF_ERROR(writer->AppendTable(t));
  return writer->Finish(/*keep=*/100);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void PutFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Three sync steps of two ranks, a checkpoint; a fresh server restored from it holds every row,
// its optimizer slots, the tables' versions and counters as the server that wrote it, and three
// more steps end where a job that never stopped ends (lazy Adam's update count included).
TEST_F(TableCheckpointTest, SyncStepsOfTwoRanksRestoreEveryRowItsOptimizerStateAndCountersBitForBit) {
  constexpr uint64_t kBefore = 3, kAfter = 3;
  Job undisturbed = Make(1, "");
  JoinAll(undisturbed, true);
  for (uint64_t s = 0; s < kBefore + kAfter; ++s) Step(undisturbed, s);

  const std::string dir = root_ + "/job";
  Job first = Make(1, dir);
  JoinAll(first, true);
  for (uint64_t s = 0; s < kBefore; ++s) Step(first, s);
  ASSERT_TRUE(first[0].server->MaybeCheckpoint(true).ok());
  // Admission and expiry had something to count.
  const TableCounters users = (*first[0].server->Table(1))->Counters();
  ASSERT_GT(users.rows_waiting_admission, 0);
  ASSERT_GT(users.dropped_gradients, 0u);
  ASSERT_GT(users.rows_expired, 0u);

  // The file: the tables declared in its header, then each table's state and its chunks.
  absl::StatusOr<Records> records = ReadRecords(CheckpointPath(dir, kBefore));
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->header.tables_size(), kTables);
  EXPECT_EQ(records->header.tables(0).SerializeAsString(), (*first[0].server->Table(0))->spec().SerializeAsString());
  std::vector<int> chunks(kTables, 0);
  for (const pb::TableRecord& r : records->tables) {
    if (r.has_chunk()) ++chunks[r.chunk().table()];
    if (r.has_state()) {
      EXPECT_EQ(r.state().version(), kBefore);
    }
  }
  EXPECT_EQ(chunks, (std::vector<int>{1, 1, 3})) << "140000 rows of 2 floats: chunks of 65536";

  Job again = Make(1, dir);
  RestoreAtStart(again, /*from_shards=*/0);
  ExpectSameTables(again, first);
  for (int t = 0; t < kTables; ++t) {
    const TableCounters got = (*again[0].server->Table(t))->Counters();
    const TableCounters want = (*first[0].server->Table(t))->Counters();
    EXPECT_EQ(got.bytes, want.bytes);
    EXPECT_EQ(got.version, kBefore);
  }
  EXPECT_EQ(again[0].server->Status().table_bytes, first[0].server->Status().table_bytes);
  EXPECT_EQ(Weights(again), Weights(first));

  JoinAll(again, false);
  for (uint64_t s = kBefore; s < kBefore + kAfter; ++s) Step(again, s);
  ExpectSameTables(again, undisturbed);
  EXPECT_EQ(Weights(again), Weights(undisturbed));
}

// A job of one server checkpoints and comes back on 2 shards; a job of 2 shards checkpoints and
// comes back on one, and on 4 (whose shard 0 holds no partition of the old shard 1: only its
// rows are read from that file). Each shard keeps the rows RowShard gives it, with their state,
// and the job goes on to the weights and rows of one that never stopped.
TEST_F(TableCheckpointTest, OneShardsCheckpointRestoresIntoTwoShardsAndTwoShardsIntoOneOrFour) {
  constexpr uint64_t kBefore = 3, kAfter = 2;
  Job undisturbed = Make(1, "");
  JoinAll(undisturbed, true);
  for (uint64_t s = 0; s < kBefore; ++s) Step(undisturbed, s);
  Job at_checkpoint = Make(1, "");
  JoinAll(at_checkpoint, true);
  for (uint64_t s = 0; s < kBefore; ++s) Step(at_checkpoint, s);
  for (uint64_t s = kBefore; s < kBefore + kAfter; ++s) Step(undisturbed, s);

  for (auto [from, to] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{2, 4}}) {
    SCOPED_TRACE(absl::StrCat(from, " shard(s) into ", to));
    const std::string dir = absl::StrCat(root_, "/job-", from, "-", to);
    {
      Job first = Make(from, dir);
      JoinAll(first, true);
      for (uint64_t s = 0; s < kBefore; ++s) Step(first, s);
      for (Shard& shard : first) ASSERT_TRUE(shard.server->MaybeCheckpoint(true).ok());
      ExpectSameTables(first, at_checkpoint);
    }
    Job again = Make(to, dir);
    RestoreAtStart(again, from);
    ExpectSameTables(again, at_checkpoint);
    for (const Shard& shard : again) {
      for (int t = 0; t < kTables; ++t) {
        const int held_here = static_cast<int>((*shard.server->Table(t))->Counters().rows);
        int expected = 0;
        for (uint64_t id = 0; id < kUniverse[t]; ++id) {
          if (RowShard(id, to) == shard.server->options().shard) {
            expected += !TableOf(at_checkpoint, t, id).RowForTest(id).empty();
          }
        }
        EXPECT_EQ(held_here, expected);
      }
    }
    JoinAll(again, false);
    for (uint64_t s = kBefore; s < kBefore + kAfter; ++s) Step(again, s);
    ExpectSameTables(again, undisturbed);
    EXPECT_EQ(Weights(again), Weights(undisturbed));
  }
}

// The rows of a step come before its dense gradients: while a table is a step ahead of the
// partitions, a sync checkpoint is not taken (FAILED_PRECONDITION, retried); a sharded job's
// frozen version that a table has passed is skipped for the next multiple.
TEST_F(TableCheckpointTest, ASyncCheckpointIsTakenOnlyWhileEveryTableIsAtThePartitionsVersion) {
  {
    const std::string dir = root_ + "/one";
    Job job = Make(1, dir);
    JoinAll(job, true);
    Step(job, 0);
    PushRows(job, 1);
    absl::Status refused = job[0].server->MaybeCheckpoint(true);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find("embedding table 'items' is at version 2, the partitions at 1"),
              absl::string_view::npos)
        << refused;
    EXPECT_TRUE(CheckpointVersions(dir).empty());
    PushDense(job, 1);
    ASSERT_TRUE(job[0].server->MaybeCheckpoint(true).ok());
    EXPECT_EQ(CheckpointVersions(dir), std::vector<uint64_t>{2});
  }
  const std::string dir = root_ + "/two";
  Job job = Make(2, dir, Mode::kSync, /*every=*/2);
  JoinAll(job, true);
  Step(job, 0);
  Step(job, 1);  // every partition froze version 2, and the tables are at it
  ASSERT_TRUE(job[0].server->MaybeCheckpoint(false).ok());
  PushRows(job, 2);  // the tables move on to 3 before shard 1 writes
  ASSERT_TRUE(job[1].server->MaybeCheckpoint(false).ok());
  PushDense(job, 2);
  Step(job, 3);
  for (Shard& shard : job) ASSERT_TRUE(shard.server->MaybeCheckpoint(false).ok());
  EXPECT_EQ(CheckpointVersions(ShardCheckpointDir(dir, 0, 2)), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(CheckpointVersions(ShardCheckpointDir(dir, 1, 2)), (std::vector<uint64_t>{4}));
  Job again = Make(2, dir, Mode::kSync, 2);
  RestoreAtStart(again, 0);
  ExpectSameTables(again, job);
}

// A shard that rolls back to its checkpoint (to agree with the other shards) takes its tables
// back too, rows and state; a pull parked on the tables it leaves is told to join again.
TEST_F(TableCheckpointTest, ARollBackRestoresTheShardsTablesToo) {
  Job at2 = Make(2, "");
  JoinAll(at2, true);
  for (uint64_t s = 0; s < 2; ++s) Step(at2, s);
  const std::string dir = root_ + "/job";
  Job job = Make(2, dir);
  JoinAll(job, true);
  for (uint64_t s = 0; s < 2; ++s) Step(job, s);
  ASSERT_TRUE(job[0].server->MaybeCheckpoint(true).ok());
  Step(job, 2);
  auto parked = std::make_shared<FakeCall>();
  SparsePullView pull;
  pull.table = 0;
  pull.min_version = 4;
  for (uint64_t id = 0; id < 10; ++id) {
    if (RowShard(id, 2) == 0) pull.ids.push_back(id);
  }
  ASSERT_FALSE(pull.ids.empty());
  job[0].server->SparsePull(std::move(pull), parked);
  EXPECT_FALSE(parked->answered());

  absl::StatusOr<bool> rolled = job[0].server->RollBack(0, 0, 2, 3);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_TRUE(*rolled);
  EXPECT_EQ(parked->Wait().code(), absl::StatusCode::kNotFound);
  for (int t = 0; t < kTables; ++t) {
    SCOPED_TRACE(Tables()[t].name());
    const EmbeddingTable& got = **job[0].server->Table(t);
    const EmbeddingTable& want = **at2[0].server->Table(t);
    EXPECT_EQ(got.version(), 2u);
    uint64_t differ = 0;
    for (uint64_t id = 0; id < kUniverse[t]; ++id) {
      if (RowShard(id, 2) != 0) continue;
      bool same = got.RowForTest(id) == want.RowForTest(id);
      for (int k = 0; k < static_cast<int>(want.slot_names().size()); ++k) {
        same = same && got.SlotForTest(id, k) == want.SlotForTest(id, k);
      }
      differ += !same;
    }
    EXPECT_EQ(differ, 0u);
    EXPECT_EQ(got.Counters().rows, want.Counters().rows);
    EXPECT_EQ(got.Counters().rows_created, want.Counters().rows_created);
  }
}

// Async: each push applies on arrival and each table checkpoints its own version and every
// rank's count of pushes; a restored server refuses a push it has applied.
TEST_F(TableCheckpointTest, AsyncTablesKeepTheirOwnVersionsAndPushCounts) {
  const std::string dir = root_ + "/async";
  Job job = Make(1, dir, Mode::kAsync);
  JoinAll(job, true);
  PushRows(job, 0);
  PushRows(job, 1, /*only_rank=*/0);
  PushRows(job, 2, /*only_rank=*/0);
  PushDense(job, 0);
  ASSERT_TRUE(job[0].server->MaybeCheckpoint(true).ok());
  Job again = Make(1, dir, Mode::kAsync);
  RestoreAtStart(again, 0);
  ExpectSameTables(again, job);
  const EmbeddingTable& items = **again[0].server->Table(0);
  EXPECT_EQ(items.version(), 4u);
  EXPECT_EQ(items.NextStep(0), 3u);
  EXPECT_EQ(items.NextStep(1), 1u);
  JoinAll(again, false);
  SparsePushView retried;
  retried.rank = 0;
  retried.table = 0;
  retried.step = 2;
  retried.num_examples = 1;
  EXPECT_EQ(again[0].server->SparsePush(retried).status().code(), absl::StatusCode::kAlreadyExists);
}

// A torn or corrupt table record is DATA_LOSS, wherever the file is damaged, and so is a whole
// file that lost a chunk or a chunk's optimizer slots; nothing is restored.
TEST_F(TableCheckpointTest, ATornOrCorruptTableChunkIsDataLoss) {
  const std::string dir = root_ + "/job";
  Job job = Make(1, dir);
  JoinAll(job, true);
  for (uint64_t s = 0; s < 2; ++s) Step(job, s);
  ASSERT_TRUE(job[0].server->MaybeCheckpoint(true).ok());
  const std::string path = CheckpointPath(dir, 2);
  ASSERT_TRUE(RestoreFile(path).ok());
  const std::string file = FileBytes(path);
  absl::StatusOr<Records> records = ReadRecords(path);
  ASSERT_TRUE(records.ok()) << records.status();
  // The tables' records are the file's last bytes but its CRC's: most of it ("many").
  const size_t chunk_bytes = records->tables.back().ByteSizeLong();
  ASSERT_GT(chunk_bytes, 1000u);
  const std::string damaged = root_ + "/damaged/ckpt-000000000002.summa";
  std::filesystem::create_directories(root_ + "/damaged");

  for (size_t at : {file.size() - 4 - chunk_bytes / 2, file.size() - 4 - chunk_bytes - 10, file.size() / 2}) {
    SCOPED_TRACE(at);
    std::string flipped = file;
    flipped[at] ^= 0x20;
    PutFile(damaged, flipped);
    absl::Status s = RestoreFile(damaged);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("checksum mismatch"), absl::string_view::npos) << s;
    PutFile(damaged, file.substr(0, at));
    EXPECT_EQ(RestoreFile(damaged).code(), absl::StatusCode::kDataLoss) << RestoreFile(damaged);
    // Cut inside a chunk with its length and CRC made to agree: the record does not parse.
    std::string body = file.substr(16, at - 16);
    std::string cut("SUMMACK1");
    for (int i = 0; i < 8; ++i) cut.push_back(static_cast<char>(body.size() >> (8 * i)));
    cut += body;
    const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(cut.data()), cut.size());
    for (int i = 0; i < 4; ++i) cut.push_back(static_cast<char>(crc >> (8 * i)));
    PutFile(damaged, cut);
    absl::Status parsed = RestoreFile(damaged);
    EXPECT_EQ(parsed.code(), absl::StatusCode::kDataLoss) << parsed;
  }

  // Whole files (length and CRC as the writer makes them) that lost a chunk, or a chunk's slots.
  std::filesystem::remove_all(root_ + "/damaged");
  Records lost = *records;
  int second_many = -1;
  for (size_t i = 0, seen = 0; i < lost.tables.size(); ++i) {
    if (lost.tables[i].has_chunk() && lost.tables[i].chunk().table() == 2 && seen++ == 1) second_many = static_cast<int>(i);
  }
  ASSERT_GE(second_many, 0);
  lost.tables.erase(lost.tables.begin() + second_many);
  absl::StatusOr<std::string> written = WriteRecords(root_ + "/lost", lost);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::Status s = RestoreFile(*written);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("holds 74464 rows of embedding table 'many', whose state counts 140000"),
            absl::string_view::npos)
      << s;

  Records slotless = *records;
  for (pb::TableRecord& r : slotless.tables) {
    if (r.has_chunk() && r.chunk().table() == 0) r.mutable_chunk()->clear_slots();
  }
  written = WriteRecords(root_ + "/slotless", slotless);
  ASSERT_TRUE(written.ok()) << written.status();
  s = RestoreFile(*written);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("a chunk of embedding table 'items' is malformed"), absl::string_view::npos) << s;

  Records stateless = *records;
  stateless.tables.erase(stateless.tables.begin());
  written = WriteRecords(root_ + "/stateless", stateless);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(RestoreFile(*written).code(), absl::StatusCode::kDataLoss);

  Records tableless = *records;
  tableless.tables.clear();
  written = WriteRecords(root_ + "/tableless", tableless);
  ASSERT_TRUE(written.ok()) << written.status();
  s = RestoreFile(*written);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("holds the records of 0 of its 3 embedding table(s)"), absl::string_view::npos) << s;
}

// A job without tables writes the checkpoints it always wrote (no table field), and they restore:
// the model comes back without tables.
TEST_F(TableCheckpointTest, ACheckpointWithoutTablesStillRestores) {
  const std::string dir = root_ + "/job";
  Job job = Make(1, dir);
  JoinAll(job, true, /*tables=*/{});
  PushDense(job, 0);
  ASSERT_TRUE(job[0].server->MaybeCheckpoint(true).ok());
  const std::string file = FileBytes(CheckpointPath(dir, 1));
  absl::StatusOr<Records> records = ReadRecords(CheckpointPath(dir, 1));
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->header.tables_size(), 0);
  EXPECT_TRUE(records->tables.empty());
  // What the writer of the release before tables wrote: the header, then the partitions.
  absl::StatusOr<std::string> old = WriteRecords(root_ + "/old", *records);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(FileBytes(*old), file);

  Job again = Make(1, dir);
  RestoreAtStart(again, 0);
  EXPECT_EQ(Weights(again), Weights(job));
  EXPECT_EQ(again[0].server->Status().version, 1u);
  EXPECT_EQ(again[0].server->Table(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace summa::server
