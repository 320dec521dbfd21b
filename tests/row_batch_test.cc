// RowBatch (client/row_batch.h): a batch's ids deduplicated, grouped by the shard RowShard gives
// them, rows scattered back to every position, duplicates' gradients summed, buffers reused.
#include "client/row_batch.h"

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "common/row_hash.h"
#include "gtest/gtest.h"

namespace summa::worker {
namespace {

// Row `id`'s values, distinct per id and column.
std::vector<float> RowsOf(const std::vector<uint64_t>& ids, int dim) {
  std::vector<float> rows;
  for (uint64_t id : ids) {
    for (int k = 0; k < dim; ++k) rows.push_back(static_cast<float>(id % 1000) * 10 + k);
  }
  return rows;
}

// Every invariant of a plan of `ids` over `shards`.
void ExpectPlanOf(const RowBatch& batch, const std::vector<uint64_t>& ids, int shards) {
  ASSERT_EQ(batch.size(), ids.size());
  ASSERT_EQ(batch.shards(), shards);
  const std::set<uint64_t> distinct(ids.begin(), ids.end());
  ASSERT_EQ(batch.distinct(), distinct.size());
  EXPECT_EQ(std::set<uint64_t>(batch.ids().begin(), batch.ids().end()), distinct);  // each once
  size_t at = 0;
  for (int s = 0; s < shards; ++s) {
    EXPECT_EQ(batch.begin(s), at);
    for (size_t r = batch.begin(s); r < batch.begin(s) + batch.count(s); ++r) {
      EXPECT_EQ(RowShard(batch.ids()[r], shards), s) << "id " << batch.ids()[r];
    }
    at += batch.count(s);
  }
  EXPECT_EQ(at, batch.distinct());
  // Each shard's ids in the order the batch first names them.
  std::map<uint64_t, size_t> first;
  for (size_t i = 0; i < ids.size(); ++i) first.emplace(ids[i], i);
  for (int s = 0; s < shards; ++s) {
    for (size_t r = batch.begin(s) + 1; r < batch.begin(s) + batch.count(s); ++r) {
      EXPECT_LT(first[batch.ids()[r - 1]], first[batch.ids()[r]]);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(batch.ids()[batch.row_of(i)], ids[i]) << "position " << i;
}

TEST(RowBatchTest, DuplicatesBecomeOneRowInTheOrderFirstNamed) {
  RowBatch batch;
  const std::vector<uint64_t> ids = {5, 7, 5, 9, 7, 5};
  batch.Plan(ids, 1);
  ExpectPlanOf(batch, ids, 1);
  EXPECT_EQ(std::vector<uint64_t>(batch.ids().begin(), batch.ids().end()), (std::vector<uint64_t>{5, 7, 9}));
  std::vector<uint32_t> rows;
  for (size_t i = 0; i < ids.size(); ++i) rows.push_back(batch.row_of(i));
  EXPECT_EQ(rows, (std::vector<uint32_t>{0, 1, 0, 2, 1, 0}));
  EXPECT_FALSE(batch.identity());
}

TEST(RowBatchTest, DistinctIdsGoToTheShardRowShardNames) {
  RowBatch batch;
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 500; ++i) ids.push_back((i * 7919) % 313);  // duplicates among them
  ids.push_back(0);
  ids.push_back(UINT64_MAX);
  ids.push_back(UINT64_MAX);
  for (int shards : {1, 2, 3, 8}) {
    batch.Plan(ids, shards);
    ExpectPlanOf(batch, ids, shards);
    EXPECT_FALSE(batch.identity());
  }
}

TEST(RowBatchTest, ABatchOfDistinctIdsOnOneShardIsItsOwnPlan) {
  RowBatch batch;
  const std::vector<uint64_t> ids = {3, 1, 4, 15, 9, 2, 6};
  batch.Plan(ids, 1);
  EXPECT_TRUE(batch.identity());
  EXPECT_EQ(std::vector<uint64_t>(batch.ids().begin(), batch.ids().end()), ids);
  // On several shards only when one shard holds every id.
  std::vector<uint64_t> one_shard;
  for (uint64_t id = 0; one_shard.size() < 5; ++id) {
    if (RowShard(id, 3) == 2) one_shard.push_back(id);
  }
  batch.Plan(one_shard, 3);
  EXPECT_TRUE(batch.identity());
  EXPECT_EQ(batch.count(2), one_shard.size());
  batch.Plan(ids, 3);
  EXPECT_FALSE(batch.identity());
  batch.Plan({}, 3);
  EXPECT_TRUE(batch.identity());
  EXPECT_EQ(batch.distinct(), 0u);
}

TEST(RowBatchTest, ScatterCopiesEachRowToEveryPositionNamingIt) {
  RowBatch batch;
  const std::vector<uint64_t> ids = {11, 12, 11, 13, 12, 11, 14};
  constexpr int kDim = 3;
  batch.Plan(ids, 2);
  const std::vector<uint64_t> distinct(batch.ids().begin(), batch.ids().end());
  const std::vector<float> distinct_rows = RowsOf(distinct, kDim);
  std::vector<float> rows(ids.size() * kDim, -1);
  batch.Scatter(distinct_rows.data(), kDim, rows.data());
  EXPECT_EQ(rows, RowsOf(ids, kDim));
}

TEST(RowBatchTest, SumAddsTheRowsOfAnIdNamedTwiceInPositionOrder) {
  RowBatch batch;
  const std::vector<uint64_t> ids = {21, 22, 21, 23, 21};
  constexpr int kDim = 2;
  const std::vector<float> grads = {1, 2, 10, 20, 0.5f, 0.25f, 7, 8, 100, -3};
  batch.Plan(ids, 3);
  std::vector<float> summed(batch.distinct() * kDim, -1);
  batch.Sum(grads.data(), kDim, summed.data());
  std::map<uint64_t, std::vector<float>> want = {
      {21, {(1 + 0.5f) + 100, (2 + 0.25f) + -3}}, {22, {10, 20}}, {23, {7, 8}}};
  for (size_t r = 0; r < batch.distinct(); ++r) {
    const std::vector<float> got(summed.begin() + r * kDim, summed.begin() + (r + 1) * kDim);
    EXPECT_EQ(got, want[batch.ids()[r]]) << "id " << batch.ids()[r];
  }
}

TEST(RowBatchTest, ReusedBatchesForgetTheLastOnesIdsAndKeepTheirIndex) {
  RowBatch batch;
  std::vector<uint64_t> big;
  for (uint64_t i = 0; i < 4096; ++i) big.push_back(i * 3);
  batch.Plan(big, 2);
  const size_t capacity = batch.index_capacity();
  // Smaller batches, some of the same ids and some new: none sees the earlier batches' ids.
  for (int round = 0; round < 100; ++round) {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 300; ++i) ids.push_back((i * 5 + round) % 997);
    batch.Plan(ids, 2);
    ExpectPlanOf(batch, ids, 2);
    ASSERT_EQ(batch.index_capacity(), capacity) << "round " << round;
  }
  batch.Plan(big, 2);
  ExpectPlanOf(batch, big, 2);
  EXPECT_EQ(batch.index_capacity(), capacity);
}

}  // namespace
}  // namespace summa::worker
