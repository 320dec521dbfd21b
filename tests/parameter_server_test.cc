// The core's model, members and status (server/core/parameter_server.cc): the first join defines
// the model (whole or partition by partition), joins that disagree with it are refused, and a
// shard holds only its own partitions.
#include "server/core/parameter_server.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

TEST_F(ParameterServerTest, InitialValuesFollowPartitionByPartition) {
  JoinRequestView definer = JoinView(0, false);
  definer.values_follow = true;
  auto joined = ps_.Join(definer);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(joined->initialize);
  ASSERT_EQ(joined->partitions.size(), 2u);
  EXPECT_EQ(ps_.Status().partitions_pending, 2);
  // Until every partition has values: joins without them wait, pushes and pulls are refused.
  absl::Status waiting = ps_.Join(JoinView(1, false)).status();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(waiting.message().find("0 of 2 partitions"), absl::string_view::npos) << waiting;
  const std::string grad = Bytes({1, 1, 1, 1});
  EXPECT_EQ(ps_.Push(PushView(0, 0, 0, grad, 1)).status().code(), absl::StatusCode::kFailedPrecondition);
  auto early = std::make_shared<FakeCall>();
  ps_.Pull(0, 0, 0, 0, early);
  EXPECT_EQ(early->Wait().code(), absl::StatusCode::kFailedPrecondition);
  // Bad values change nothing; a stranger is refused.
  const std::string wb = w_;
  EXPECT_EQ(ps_.Initialize({0, 0, true, absl::string_view(wb).substr(4)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({0, 7, true, wb}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({0, 0, false, wb}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Initialize({1, 0, true, wb}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ps_.Status().partitions_pending, 2);
  // The first values a partition gets are kept.
  EXPECT_EQ(*ps_.Initialize({0, 0, true, wb}), true);
  const std::string other = Bytes({9, 9, 9, 9});
  EXPECT_EQ(*ps_.Initialize({0, 0, true, other}), false);
  EXPECT_EQ(ps_.Status().partitions_pending, 1);
  EXPECT_EQ(*ps_.Initialize({0, 1, true, b_}), true);
  EXPECT_EQ(ps_.Status().partitions_pending, 0);
  EXPECT_EQ(Weights(ps_), (std::vector<float>{1, 2, 3, 4, 10, 20}));
  auto second = ps_.Join(JoinView(1, false));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->initialize);
  auto pulled = std::make_shared<FakeCall>();
  ps_.Pull(1, 0, 1, 0, pulled);
  ASSERT_TRUE(pulled->Wait().ok());
  EXPECT_EQ(pulled->values(), (std::vector<float>{10, 20}));
}

TEST_F(ParameterServerTest, FirstJoinWithValuesDefinesTheModel) {
  EXPECT_EQ(ps_.Join(JoinView(1, false)).status().code(), absl::StatusCode::kUnavailable);
  auto joined = ps_.Join(JoinView(0, true));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank, 0);
  EXPECT_EQ(joined->version, 0u);
  ASSERT_EQ(joined->partitions.size(), 2u);
  EXPECT_EQ(Weights(ps_), (std::vector<float>{1, 2, 3, 4, 10, 20}));
  EXPECT_TRUE(ps_.Join(JoinView(1, false)).ok());
  const StatusSnapshot s = ps_.Status();
  EXPECT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.parameter_count, 6);
  EXPECT_EQ(s.partition_count, 2);
}

TEST_F(ParameterServerTest, JoinsThatDisagreeAreRefused) {
  ASSERT_TRUE(ps_.Join(JoinView(0, true)).ok());
  JoinRequestView wrong_shape = JoinView(1, false);
  wrong_shape.params[0].spec.shape = {4, 1};
  auto r = ps_.Join(wrong_shape);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("[2, 2]"), absl::string_view::npos) << r.status();
  JoinRequestView extra = JoinView(1, false);
  extra.params.push_back({{"ghost", DType::kFloat32, {3}}, ""});
  r = ps_.Join(extra);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("unknown parameter 'ghost'"), absl::string_view::npos);
  JoinRequestView renamed = JoinView(1, false);
  renamed.params[1].spec.name = "bias";
  EXPECT_EQ(ps_.Join(renamed).status().code(), absl::StatusCode::kFailedPrecondition);
  JoinRequestView world = JoinView(1, false);
  world.world_size = 3;
  EXPECT_EQ(ps_.Join(world).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Join(JoinView(5, false)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps_.Status().members.size(), 1u);
}

TEST_F(ParameterServerTest, BadInitialValuesAreRefused) {
  JoinRequestView v = JoinView(0, true);
  v.params[0].data = w_.substr(0, 8);
  EXPECT_EQ(ps_.Join(v).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ps_.Status().model_defined);
}

TEST(JoinTest, ARefusedJoinDefinesNoModel) {
  ServerOptions o;
  o.require_sessions = false;
  o.world_size = 2;
  ParameterServer ps(o);
  JoinRequestView v;
  v.rank = 7;
  v.world_size = 2;
  const std::string bytes(8, '\0');
  v.params = {{{"w", DType::kFloat32, {2}}, bytes}};
  EXPECT_EQ(ps.Join(v).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ps.Status().model_defined);
}

TEST_F(MembershipTest, AShardHoldsItsPartitionsAndRefusesTheOthersByName) {
  ServerOptions o;
  o.partition_bytes = 8;  // two partitions of two floats: partition 0 on shard 0, 1 on shard 1
  o.shards = 2;
  o.shard = 1;
  auto ps = Make(o);
  auto joined = ps->Join(Rejoin(0));
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->partitions.size(), 1u);
  EXPECT_EQ(joined->partitions[0].id, 1u);
  EXPECT_EQ(joined->partitions[0].offset, 2);
  const std::vector<float> twos = {2, 2};
  const std::string bytes(reinterpret_cast<const char*>(twos.data()), 8);
  auto refused = ps->Push(Push(0, 0, bytes, 1));
  EXPECT_EQ(refused.status().message(), "partition 0 is held by shard 0, not this one (shard 1 of 2)");
  PushRequestView mine = Push(0, 0, bytes, 1);
  mine.partition = 1;
  EXPECT_TRUE(ps->Push(mine).ok());
  EXPECT_EQ(ps->Status().partition_count, 1);
  // Its first partition reports the job's steps and rate (partition 0 is another shard's).
  EXPECT_EQ(ps->Status().learning_rate, 1.0);
}

TEST_F(MembershipTest, AModelOfFewerPartitionsThanShardsIsRefused) {
  ServerOptions o;
  o.world_size = 2;
  o.shards = 2;
  o.clock = &clock_;
  ParameterServer ps(o);
  JoinRequestView v;
  v.rank = 0;
  v.world_size = 2;
  v.params = {{{"w", DType::kFloat32, {4}}, absl::string_view(zeros_)}};
  auto joined = ps.Join(v);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(joined.status().message().find("2 shards need at least 2"), absl::string_view::npos) << joined.status();
}

TEST(ShardOptionsTest, AShardComesFromItsFlagsOrItsPodsOrdinal) {
  EXPECT_EQ(*ShardFromHostname("summa-server-1"), 1);
  EXPECT_EQ(*ShardFromHostname("summa-server-12"), 12);
  for (const char* bad : {"summa-server", "summa-server-x", "", "summa-server-1a"}) {
    const absl::StatusOr<int> refused = ShardFromHostname(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find(absl::StrCat("'", bad, "'")), absl::string_view::npos) << refused.status();
  }
  EXPECT_FALSE(ShardFromHostname(nullptr).ok());
  ServerOptions o;
  o.shards = 2;
  o.shard = 1;
  EXPECT_TRUE(ValidateOptions(o).ok());
  for (auto [shard, shards] : {std::pair{2, 2}, {-1, 2}, {0, 0}}) {
    o.shard = shard;
    o.shards = shards;
    const absl::Status s = ValidateOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shard << " of " << shards;
    EXPECT_NE(s.message().find(absl::StrCat("shard ", shard, " of ", shards)), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace summa::server
