#include "server/all_reduce.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

AllReduceContribution Contribution(int rank, const std::string& data, std::vector<int64_t> shape,
                                   int group = 3) {
  AllReduceContribution c;
  c.name = "grads";
  c.group_size = group;
  c.rank = rank;
  c.spec = {"t", DType::kFloat32, std::move(shape)};
  c.data = data;
  return c;
}

TEST(AllReduceHubTest, EveryMemberReceivesTheSumRoundAfterRound) {
  AllReduceHub hub(absl::Seconds(30));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<FakeCall>> calls;
    std::vector<std::string> data;
    for (int r = 0; r < 3; ++r) data.push_back(Bytes({float(r), float(10 * r + round)}));
    for (int r = 0; r < 3; ++r) {
      calls.push_back(std::make_shared<FakeCall>());
      hub.Contribute(Contribution(r, data[r], {2}), calls.back());
      EXPECT_EQ(calls[0]->answered(), r == 2);
    }
    for (auto& c : calls) {
      ASSERT_TRUE(c->Wait().ok());
      EXPECT_EQ(c->values(), (std::vector<float>{3, float(30 + 3 * round)}));
      EXPECT_EQ(c->counter(), uint64_t(round + 1));
    }
  }
  EXPECT_EQ(hub.rounds_completed(), 3u);
}

TEST(AllReduceHubTest, DisagreementsAreRefusedWithoutSpoilingTheRound) {
  AllReduceHub hub(absl::Seconds(30));
  const std::string two = Bytes({1, 2});
  auto first = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(0, two, {2}), first);

  struct Case {
    const char* what;
    AllReduceContribution c;
    absl::StatusCode code;
  };
  const std::string three = Bytes({1, 2, 3});
  std::vector<Case> cases = {
      {"other shape", Contribution(1, three, {3}), absl::StatusCode::kInvalidArgument},
      {"duplicate rank", Contribution(0, two, {2}), absl::StatusCode::kAlreadyExists},
      {"rank outside group", Contribution(3, two, {2}), absl::StatusCode::kInvalidArgument},
      {"other group size", Contribution(1, two, {2}, 4), absl::StatusCode::kInvalidArgument},
      {"bytes unlike shape", Contribution(1, three, {2}), absl::StatusCode::kInvalidArgument},
  };
  for (Case& c : cases) {
    auto call = std::make_shared<FakeCall>();
    hub.Contribute(c.c, call);
    EXPECT_EQ(call->Wait().code(), c.code) << c.what;
  }
  auto second = std::make_shared<FakeCall>();
  auto third = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(1, two, {2}), second);
  hub.Contribute(Contribution(2, two, {2}), third);
  ASSERT_TRUE(first->Wait().ok());
  EXPECT_EQ(first->values(), (std::vector<float>{3, 6}));
}

TEST(AllReduceHubTest, UnfilledRoundIsAbandonedAtTheDeadline) {
  AllReduceHub hub(absl::Seconds(5));
  const std::string data = Bytes({1});
  auto call = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(1, data, {1}), call);
  hub.ExpireRounds(absl::Now());
  EXPECT_FALSE(call->answered());
  hub.ExpireRounds(absl::Now() + absl::Seconds(6));
  absl::Status s = call->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("missing ranks 0, 2"), absl::string_view::npos) << s;
  // The next round starts clean.
  std::vector<std::shared_ptr<FakeCall>> calls;
  for (int r = 0; r < 3; ++r) {
    calls.push_back(std::make_shared<FakeCall>());
    hub.Contribute(Contribution(r, data, {1}), calls.back());
  }
  ASSERT_TRUE(calls[0]->Wait().ok());
  EXPECT_EQ(calls[0]->values(), std::vector<float>{3});
}

}  // namespace
}  // namespace summa::server
