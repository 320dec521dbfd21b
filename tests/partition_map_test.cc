#include "common/partition_map.h"

#include "gtest/gtest.h"

namespace summa {
namespace {

TEST(PartitionMapTest, LaysTensorsEndToEndAndCutsByBytes) {
  auto map = PartitionMap::Create({{"a", DType::kFloat32, {3, 2}}, {"b", DType::kFloat32, {5}}}, 16);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->num_elements(), 11);
  EXPECT_EQ(map->tensor_offset(0), 0);
  EXPECT_EQ(map->tensor_offset(1), 6);
  ASSERT_EQ(map->partitions().size(), 3u);  // 4 + 4 + 3 floats
  EXPECT_EQ(map->partitions()[2].offset, 8);
  EXPECT_EQ(map->partitions()[2].length, 3);
  EXPECT_EQ(map->partitions()[1].id, 1u);
}

TEST(PartitionMapTest, OnePartitionWhenTheModelFits) {
  auto map = PartitionMap::Create({{"w", DType::kFloat32, {10}}}, 4 << 20);
  ASSERT_TRUE(map.ok());
  ASSERT_EQ(map->partitions().size(), 1u);
  EXPECT_EQ(map->partitions()[0].length, 10);
}

TEST(PartitionMapTest, ShardsAreBalancedByBytesTheLargestFirst) {
  // 10, 10, 10, 5, 5: the three 10s go to shards 0, 1, 0 (a tie to the lower shard), the 5s to
  // shard 1, the lighter: 20 floats each.
  const std::vector<PartitionRange> parts = {{0, 0, 10}, {1, 10, 10}, {2, 20, 10}, {3, 30, 5}, {4, 35, 5}};
  EXPECT_EQ(AssignShards(parts, 2), (std::vector<int>{0, 1, 0, 1, 1}));
  EXPECT_EQ(AssignShards(parts, 1), (std::vector<int>{0, 0, 0, 0, 0}));
  // A small partition first in id order still waits for the large ones.
  EXPECT_EQ(AssignShards({{0, 0, 1}, {1, 1, 8}, {2, 9, 8}}, 2), (std::vector<int>{0, 0, 1}));
}

TEST(PartitionMapTest, RefusesBadModels) {
  EXPECT_FALSE(PartitionMap::Create({}, 16).ok());
  EXPECT_FALSE(PartitionMap::Create({{"w", DType::kFloat32, {0}}}, 16).ok());
  EXPECT_FALSE(PartitionMap::Create({{"w", DType::kFloat32, {-1, 2}}}, 16).ok());
  EXPECT_FALSE(PartitionMap::Create({{"w", DType::kFloat32, {2}}, {"w", DType::kFloat32, {2}}}, 16).ok());
  EXPECT_FALSE(PartitionMap::Create({{"", DType::kFloat32, {2}}}, 16).ok());
  EXPECT_FALSE(PartitionMap::Create({{"w", DType::kFloat32, {2}}}, 3).ok());
}

}  // namespace
}  // namespace summa
