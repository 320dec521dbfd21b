// EmbeddingTable: rows created on first pull from a deterministic initializer, summed per step
// over the group and stepped by a row-wise optimizer that touches only the rows pushed,
// admission and expiry counted, the memory bound, bad input refused, and the state saved and
// restored bit for bit (into another shard count too).
#include "server/core/embedding_table.h"

#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/optimizer.h"
#include "common/row_hash.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

pb::EmbeddingTableSpec Spec(const std::string& optimizer, int dim = 4) {
  pb::EmbeddingTableSpec spec;
  spec.set_name("items");
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind("uniform");
  spec.mutable_initializer()->set_a(-0.5);
  spec.mutable_initializer()->set_b(0.5);
  spec.mutable_initializer()->set_seed(7);
  spec.mutable_optimizer()->set_name(optimizer);
  spec.mutable_optimizer()->set_learning_rate(0.5);
  return spec;
}

class TableTest : public ::testing::Test {
 protected:
  std::unique_ptr<EmbeddingTable> Make(const pb::EmbeddingTableSpec& spec, Mode mode = Mode::kSync, int shard = 0,
                                       int shards = 1) {
    TableContext c;
    c.mode = mode;
    c.shard = shard;
    c.shards = shards;
    c.members = &members_;
    c.memory = &memory_;
    absl::StatusOr<std::unique_ptr<EmbeddingTable>> t = EmbeddingTable::Create(spec, c);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  // The rows of `ids` at version >= min_version, answered at once (or the status it was refused with).
  absl::StatusOr<std::vector<float>> Pull(EmbeddingTable& t, std::vector<uint64_t> ids, uint64_t min_version = 0) {
    auto call = std::make_shared<FakeCall>();
    {
      CallsToFinish out;
      t.Pull(std::move(ids), min_version, clock_.Now() + absl::Seconds(5), call, out);
    }
    if (!call->answered()) return absl::UnavailableError("parked");
    absl::Status s = call->Wait();
    if (!s.ok()) return s;
    return call->values();
  }

  absl::StatusOr<bool> Push(EmbeddingTable& t, int rank, uint64_t step, int64_t examples, std::vector<uint64_t> ids,
                            std::vector<float> grads) {
    CallsToFinish out;
    return t.Push(rank, step, examples, ids, grads, out);
  }

  FakeClock clock_;
  Membership members_{2, OnWorkerLoss::kShrink, absl::Seconds(10), absl::Seconds(60), &clock_};
  TableMemory memory_{0};
};

TEST_F(TableTest, RowsStartFromTheirIdAndSeedWhateverTheShardCount) {
  std::unique_ptr<EmbeddingTable> one = Make(Spec("sgd"));
  absl::StatusOr<std::vector<float>> a = Pull(*one, {3, 99, 3});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 12u);
  EXPECT_EQ(std::vector<float>(a->begin(), a->begin() + 4), std::vector<float>(a->begin() + 8, a->end()));
  for (float v : *a) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
  }
  EXPECT_NE(std::vector<float>(a->begin(), a->begin() + 4), std::vector<float>(a->begin() + 4, a->begin() + 8));
  // Row 99 on whichever of 3 shards holds it starts the same.
  const int shard = RowShard(99, 3);
  std::unique_ptr<EmbeddingTable> sharded = Make(Spec("sgd"), Mode::kSync, shard, 3);
  absl::StatusOr<std::vector<float>> b = Pull(*sharded, {99});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, std::vector<float>(a->begin() + 4, a->begin() + 8));
  // Another seed, other values.
  pb::EmbeddingTableSpec other = Spec("sgd");
  other.mutable_initializer()->set_seed(8);
  absl::StatusOr<std::vector<float>> c = Pull(*Make(other), {99});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *b);
  EXPECT_EQ(one->Counters().rows_created, 2u);
}

TEST_F(TableTest, SyncStepSumsEveryRankOnceAndTouchesOnlyThePushedRows) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("sgd", 2));
  absl::StatusOr<std::vector<float>> before = Pull(*t, {1, 2, 3});
  ASSERT_TRUE(before.ok());
  // Both ranks pull and push row 1; rank 0 sends row 2 twice in one push (summed).
  ASSERT_EQ(*Push(*t, 0, 0, 3, {1, 2, 2}, {1, 2, 10, 20, 30, 40}), false);
  EXPECT_EQ(t->version(), 0u);
  // A retry is recognised, not summed again.
  EXPECT_TRUE(absl::IsAlreadyExists(Push(*t, 0, 0, 3, {1}, {1, 2}).status()));
  // The next version's pull waits for the step.
  auto parked = std::make_shared<FakeCall>();
  {
    CallsToFinish out;
    t->Pull({1, 2, 3}, 1, clock_.Now() + absl::Seconds(5), parked, out);
  }
  EXPECT_FALSE(parked->answered());
  ASSERT_EQ(*Push(*t, 1, 0, 1, {1}, {3, 4}), true);
  ASSERT_TRUE(parked->Wait().ok());
  EXPECT_EQ(parked->counter(), 1u);
  const std::vector<float>& after = parked->values();
  const float lr = 0.5f, scale = 1.0f / 4;
  EXPECT_EQ(after[0], (*before)[0] - lr * ((1 + 3) * scale));
  EXPECT_EQ(after[1], (*before)[1] - lr * ((2 + 4) * scale));
  EXPECT_EQ(after[2], (*before)[2] - lr * ((10 + 30) * scale));
  EXPECT_EQ(after[3], (*before)[3] - lr * ((20 + 40) * scale));
  EXPECT_EQ(after[4], (*before)[4]);  // row 3: pulled, never pushed
  EXPECT_EQ(after[5], (*before)[5]);
  EXPECT_EQ(t->Counters().rows_pushed, 4u);
  // The finished step refuses a late rank's push and a future step is out of range.
  EXPECT_TRUE(absl::IsAlreadyExists(Push(*t, 1, 0, 1, {1}, {3, 4}).status()));
  EXPECT_TRUE(absl::IsOutOfRange(Push(*t, 1, 2, 1, {1}, {3, 4}).status()));
}

TEST_F(TableTest, RowWiseAdagradIsTheDenseRuleOnTheRowsTouched) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("adagrad", 2));
  absl::StatusOr<std::vector<float>> start = Pull(*t, {5, 6});
  ASSERT_TRUE(start.ok());
  // The dense rule on both rows, row 6's gradient zero.
  OptimizerOptions o;
  o.name = "adagrad";
  o.learning_rate = 0.5;
  o.eps = 1e-10;
  std::unique_ptr<const Optimizer> dense = *Optimizer::Create(o);
  std::vector<float> w = *start, sum(4, 0.0f);
  std::vector<absl::Span<float>> slots = {absl::MakeSpan(sum)};
  for (uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> g = {0.5f * (step + 1), -1.0f, 0.0f, 0.0f};
    dense->Apply(step, 0.5, absl::MakeSpan(w), slots, g, 2);
    ASSERT_TRUE(Push(*t, 0, step, 1, {5}, {g[0], g[1]}).ok());
    ASSERT_TRUE(*Push(*t, 1, step, 1, {}, {}));
  }
  EXPECT_EQ(t->RowForTest(5), std::vector<float>(w.begin(), w.begin() + 2));
  EXPECT_EQ(t->RowForTest(6), std::vector<float>(w.begin() + 2, w.end()));
  EXPECT_EQ(t->SlotForTest(5, 0), std::vector<float>(sum.begin(), sum.begin() + 2));
}

TEST_F(TableTest, LazyAdamMovesOnlyThePushedRowsMoments) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("adam", 2));
  ASSERT_TRUE(Pull(*t, {1, 2}).ok());
  const std::vector<float> row2 = t->RowForTest(2);
  ASSERT_TRUE(Push(*t, 0, 0, 1, {1}, {1, 1}).ok());
  ASSERT_TRUE(*Push(*t, 1, 0, 1, {}, {}));
  ASSERT_TRUE(Push(*t, 0, 1, 1, {1}, {1, 1}).ok());
  ASSERT_TRUE(*Push(*t, 1, 1, 1, {2}, {2, 2}));
  // Row 2 took one update, at the table's second (bias correction t = 1), from zero moments.
  EXPECT_EQ(t->SlotForTest(1, 0).size(), 2u);
  OptimizerOptions o;
  o.name = "adam";
  o.learning_rate = 0.5;
  std::unique_ptr<const Optimizer> adam = *Optimizer::Create(o);
  std::vector<float> w = row2, m(2, 0.0f), v(2, 0.0f);
  std::vector<absl::Span<float>> slots = {absl::MakeSpan(m), absl::MakeSpan(v)};
  adam->Apply(1, 0.5, absl::MakeSpan(w), slots, std::vector<float>{2, 2}, 2);
  EXPECT_EQ(t->RowForTest(2), w);
  EXPECT_EQ(t->SlotForTest(2, 0), m);
  EXPECT_EQ(t->SlotForTest(2, 1), v);
}

TEST_F(TableTest, AdmissionAndExpiryAreCounted) {
  pb::EmbeddingTableSpec spec = Spec("sgd", 2);
  spec.set_admit_after(3);
  spec.set_expire_after(2);
  std::unique_ptr<EmbeddingTable> t = Make(spec);
  EXPECT_EQ(*Pull(*t, {4}), std::vector<float>(2, 0.0f));
  EXPECT_EQ(*Pull(*t, {4}), std::vector<float>(2, 0.0f));
  EXPECT_EQ(t->Counters().rows_waiting_admission, 1);
  // Its gradient is dropped while it waits.
  ASSERT_TRUE(Push(*t, 0, 0, 1, {4}, {1, 1}).ok());
  ASSERT_TRUE(*Push(*t, 1, 0, 1, {}, {}));
  TableCounters c = t->Counters();
  EXPECT_EQ(c.dropped_gradients, 1u);
  EXPECT_EQ(c.unadmitted_reads, 2u);
  EXPECT_EQ(c.rows, 0);
  // The third read admits it, with its initial values.
  absl::StatusOr<std::vector<float>> admitted = Pull(*t, {4});
  ASSERT_TRUE(admitted.ok());
  EXPECT_NE(*admitted, std::vector<float>(2, 0.0f));
  c = t->Counters();
  EXPECT_EQ(c.rows, 1);
  EXPECT_EQ(c.rows_created, 1u);
  EXPECT_EQ(c.rows_waiting_admission, 0);
  // Touched at version 1; untouched through versions 2 and 3: gone at the sweep of version 4
  // (4 - 1 >= 2), not at version 2's (2 - 1 < 2).
  for (uint64_t step = 1; step < 4; ++step) {
    ASSERT_TRUE(Push(*t, 0, step, 1, {}, {}).ok());
    ASSERT_TRUE(*Push(*t, 1, step, 1, {}, {}));
    if (step == 2) EXPECT_EQ(t->Counters().rows, 1) << "expired too early";
  }
  c = t->Counters();
  EXPECT_EQ(c.rows, 0);
  EXPECT_EQ(c.rows_expired, 1u);
  EXPECT_EQ(memory_.used(), 0);
}

TEST_F(TableTest, ARowExpiresOnlyOnceUntouchedForExpireAfterSteps) {
  pb::EmbeddingTableSpec every_step = Spec("sgd", 1);
  every_step.set_expire_after(1);
  std::unique_ptr<EmbeddingTable> t = Make(every_step);
  // Used in every step: never gone, never created again.
  for (uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(Pull(*t, {4}, step).ok());
    ASSERT_TRUE(Push(*t, 0, step, 1, {4}, {1}).ok());
    ASSERT_TRUE(*Push(*t, 1, step, 1, {}, {}));
  }
  EXPECT_EQ(t->Counters().rows_expired, 0u);
  EXPECT_EQ(t->Counters().rows_created, 1u);
  pb::EmbeddingTableSpec two = Spec("sgd", 1);
  two.set_expire_after(2);
  t = Make(two);
  ASSERT_TRUE(Pull(*t, {4}).ok());
  ASSERT_TRUE(Push(*t, 0, 0, 1, {4}, {1}).ok());
  ASSERT_TRUE(*Push(*t, 1, 0, 1, {}, {}));
  // Untouched in step 1 only when version 2's sweep comes: kept.
  ASSERT_TRUE(Push(*t, 0, 1, 1, {}, {}).ok());
  ASSERT_TRUE(*Push(*t, 1, 1, 1, {}, {}));
  EXPECT_EQ(t->Counters().rows, 1) << "expired after one untouched step of two";
  // Untouched in steps 1, 2 and 3 at version 4's: gone.
  for (uint64_t step = 2; step < 4; ++step) {
    ASSERT_TRUE(Push(*t, 0, step, 1, {}, {}).ok());
    ASSERT_TRUE(*Push(*t, 1, step, 1, {}, {}));
  }
  EXPECT_EQ(t->Counters().rows, 0);
  EXPECT_EQ(t->Counters().rows_expired, 1u);
}

TEST_F(TableTest, AStepAPushAskedToSkipAppliesNoUpdate) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("adam", 1));
  const std::vector<float> start = *Pull(*t, {3});
  CallsToFinish out;
  ASSERT_TRUE(t->Push(0, 0, 1, std::vector<uint64_t>{3}, std::vector<float>{1}, out, /*skip=*/true).ok());
  ASSERT_TRUE(*Push(*t, 1, 0, 1, {3}, {2}));
  EXPECT_EQ(t->version(), 1u);
  EXPECT_EQ(t->RowForTest(3), start);
  EXPECT_EQ(t->SlotForTest(3, 0), std::vector<float>{0.0f});
  EXPECT_EQ(t->Counters().dropped_gradients, 1u);
  // The next step is a whole one again, and Adam's first update is its first (t = 0).
  ASSERT_TRUE(Push(*t, 0, 1, 1, {3}, {1}).ok());
  ASSERT_TRUE(*Push(*t, 1, 1, 1, {}, {}));
  OptimizerOptions o;
  o.name = "adam";
  o.learning_rate = 0.5;
  std::vector<float> w = start, m(1, 0.0f), v(1, 0.0f);
  std::vector<absl::Span<float>> slots = {absl::MakeSpan(m), absl::MakeSpan(v)};
  (*Optimizer::Create(o))->Apply(0, 0.5, absl::MakeSpan(w), slots, std::vector<float>{1}, 2);
  EXPECT_EQ(t->RowForTest(3), w);
}

TEST_F(TableTest, TheMemoryBoundRefusesANewRowNamingTheFlag) {
  std::unique_ptr<EmbeddingTable> probe = Make(Spec("adagrad", 8));
  const int64_t row = probe->row_bytes();
  probe.reset();
  TableMemory bounded(2 * row);
  TableContext c;
  c.members = &members_;
  c.memory = &bounded;
  std::unique_ptr<EmbeddingTable> t = *EmbeddingTable::Create(Spec("adagrad", 8), c);
  auto call = std::make_shared<FakeCall>();
  {
    CallsToFinish out;
    t->Pull({1, 2, 3}, 0, clock_.Now(), call, out);
  }
  absl::Status s = call->Wait();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("--max_table_bytes"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'items'"), std::string::npos) << s;
  EXPECT_EQ(bounded.used(), 2 * row);
  t.reset();
  EXPECT_EQ(bounded.used(), 0);
}

TEST_F(TableTest, BadInputIsRefusedNamingIt) {
  pb::EmbeddingTableSpec spec = Spec("sgd", 2);
  spec.set_num_embeddings(100);
  std::unique_ptr<EmbeddingTable> t = Make(spec, Mode::kSync, RowShard(5, 2), 2);
  absl::Status past = t->CheckIds({5, 100});
  EXPECT_TRUE(absl::IsInvalidArgument(past));
  EXPECT_NE(past.message().find("id 100 is past its num_embeddings, 100"), std::string::npos) << past;
  uint64_t other = 0;
  while (RowShard(other, 2) == RowShard(5, 2)) ++other;
  absl::Status elsewhere = t->CheckIds({other});
  EXPECT_NE(elsewhere.message().find("not this shard's"), std::string::npos) << elsewhere;
  absl::StatusOr<bool> wrong = Push(*t, 0, 0, 1, {5}, {1, 2, 3});
  EXPECT_TRUE(absl::IsInvalidArgument(wrong.status()));
  EXPECT_NE(wrong.status().message().find("rows of 2 floats"), std::string::npos) << wrong.status();
  for (auto [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer", "rmsprop"}, {"initializer", "ones"}}) {
    pb::EmbeddingTableSpec bad = Spec("sgd");
    if (field == "optimizer") bad.mutable_optimizer()->set_name(value);
    if (field == "initializer") bad.mutable_initializer()->set_kind(value);
    absl::Status s = EmbeddingTable::Normalized(bad).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s));
    EXPECT_NE(s.message().find(value), std::string::npos) << s;
  }
  pb::EmbeddingTableSpec flat = Spec("sgd", 0);
  EXPECT_NE(EmbeddingTable::Normalized(flat).status().message().find("dim 0"), std::string::npos);
}

TEST_F(TableTest, SavedRowsAndStateComeBackBitForBitIntoAnyShardCount) {
  pb::EmbeddingTableSpec spec = Spec("adagrad", 3);
  spec.set_admit_after(2);
  std::unique_ptr<EmbeddingTable> t = Make(spec);
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 40; ++id) ids.push_back(id * 7919);
  ASSERT_TRUE(Pull(*t, ids).ok());
  ASSERT_TRUE(Pull(*t, ids).ok());
  ASSERT_TRUE(Pull(*t, {123456}).ok());  // waiting for admission
  std::vector<float> grads(ids.size() * 3);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i);
  ASSERT_TRUE(Push(*t, 0, 0, 4, ids, grads).ok());
  ASSERT_TRUE(*Push(*t, 1, 0, 4, {ids[0]}, {1, 2, 3}));
  TableState state;
  std::vector<TableRows> chunks;
  ASSERT_TRUE(t->Save(&state, 16, [&](const TableRows& rows) {
                 chunks.push_back(rows);
                 return absl::OkStatus();
               }).ok());
  ASSERT_EQ(chunks.size(), 3u);  // 16 + 16 + 8
  EXPECT_EQ(state.version, 1u);
  EXPECT_EQ(state.waiting_ids, std::vector<uint64_t>{123456});
  for (int shards : {1, 2}) {
    int64_t rows = 0;
    for (int shard = 0; shard < shards; ++shard) {
      std::unique_ptr<EmbeddingTable> back = Make(spec, Mode::kSync, shard, shards);
      back->RestoreState(state);
      for (const TableRows& chunk : chunks) ASSERT_TRUE(back->RestoreRows(chunk).ok());
      EXPECT_EQ(back->version(), 1u);
      for (uint64_t id : ids) {
        if (RowShard(id, shards) != shard) {
          EXPECT_TRUE(back->RowForTest(id).empty());
          continue;
        }
        EXPECT_EQ(back->RowForTest(id), t->RowForTest(id)) << id;
        EXPECT_EQ(back->SlotForTest(id, 0), t->SlotForTest(id, 0)) << id;
      }
      rows += back->Counters().rows;
      EXPECT_EQ(back->Counters().rows_created, t->Counters().rows_created);
    }
    EXPECT_EQ(rows, 40);
  }
}

TEST_F(TableTest, AsyncAppliesEachPushOnArrival) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("sgd", 1), Mode::kAsync);
  const float w0 = (*Pull(*t, {9}))[0];
  ASSERT_TRUE(*Push(*t, 0, 0, 2, {9}, {4}));
  EXPECT_EQ(t->version(), 1u);
  EXPECT_EQ(t->RowForTest(9)[0], w0 - 0.5f * (4 * 0.5f));
  EXPECT_TRUE(absl::IsAlreadyExists(Push(*t, 0, 0, 2, {9}, {4}).status()));
}

TEST_F(TableTest, AParkedPullFailsAtItsDeadlineNamingWhoIsMissing) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("sgd", 1));
  ASSERT_TRUE(Push(*t, 0, 0, 1, {}, {}).ok());
  auto call = std::make_shared<FakeCall>();
  {
    CallsToFinish out;
    t->Pull({1}, 1, clock_.Now() + absl::Seconds(1), call, out);
  }
  {
    CallsToFinish out;
    t->Expire(clock_.Now() + absl::Seconds(2), out);
  }
  absl::Status s = call->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("rank(s) 1"), std::string::npos) << s;
}

TEST_F(TableTest, ARetiredTableGivesItsMemoryBackAndRefusesEveryCall) {
  std::unique_ptr<EmbeddingTable> t = Make(Spec("adagrad", 2));
  ASSERT_TRUE(Pull(*t, {1, 2, 3}).ok());
  auto parked = std::make_shared<FakeCall>();
  {
    CallsToFinish out;
    t->Pull({1}, 1, clock_.Now() + absl::Seconds(5), parked, out);
  }
  EXPECT_GT(memory_.used(), 0);
  const absl::Status gone = absl::NotFoundError("rolled back");
  {
    CallsToFinish out;
    t->Retire(gone, out);
  }
  EXPECT_EQ(parked->Wait(), gone);
  EXPECT_EQ(memory_.used(), 0);
  EXPECT_EQ(Pull(*t, {1}).status(), gone);
  EXPECT_EQ(Push(*t, 0, 0, 1, {1}, {1, 1}).status(), gone);
  t.reset();
  EXPECT_EQ(memory_.used(), 0);
}

TEST_F(TableTest, WaitingIdsPastTheBoundAreForgottenOnRestore) {
  pb::EmbeddingTableSpec spec = Spec("sgd", 2);
  spec.set_admit_after(3);
  TableState state;
  state.waiting_ids = {7, 8, 9};
  state.waiting_counts = {1, 2, 2};
  TableMemory tight(32);  // two waiting ids' worth
  TableContext c;
  c.members = &members_;
  c.memory = &tight;
  std::unique_ptr<EmbeddingTable> t = *EmbeddingTable::Create(spec, c);
  t->RestoreState(state);
  EXPECT_EQ(t->Counters().rows_waiting_admission, 2);
  EXPECT_EQ(tight.used(), 32);
  t.reset();
  EXPECT_EQ(tight.used(), 0);
}

}  // namespace
}  // namespace summa::server
