// The server's limits without gRPC: the per-peer and total budgets, the join rate on a fake
// clock, peer keys, flag validation, and the AllReduce hub's bounds on collectives, buffer bytes
// and the rounds one peer may hold open.
#include "server/core/limits.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/core/all_reduce.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

TEST(PeerBudgetTest, RefusesPastThePeersShareAndTheTotalNamingTheFlags) {
  PeerBudget budget("parked calls", 5, "max_parked_calls", 3, "max_parked_calls_per_peer");
  std::vector<PeerBudget::Hold> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<PeerBudget::Hold> h = budget.Take("rank 0", 1);
    ASSERT_TRUE(h.ok()) << h.status();
    held.push_back(*std::move(h));
  }
  absl::StatusOr<PeerBudget::Hold> over = budget.Take("rank 0", 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status()));
  EXPECT_TRUE(absl::StrContains(over.status().message(), "--max_parked_calls_per_peer")) << over.status();
  EXPECT_TRUE(absl::StrContains(over.status().message(), "rank 0 holds 3 parked calls")) << over.status();

  // Another peer has a share of its own, until the total runs out.
  absl::StatusOr<PeerBudget::Hold> other = budget.Take("rank 1", 2);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<PeerBudget::Hold> total = budget.Take("rank 2", 1);
  ASSERT_TRUE(absl::IsResourceExhausted(total.status()));
  EXPECT_TRUE(absl::StrContains(total.status().message(), "(summa-server --max_parked_calls)")) << total.status();
  EXPECT_EQ(budget.total(), 5);

  // A hold gives its amount back when destroyed, a moved-from one nothing.
  PeerBudget::Hold moved = std::move(held[0]);
  held.clear();
  EXPECT_EQ(budget.held_by("rank 0"), 1);
  moved = PeerBudget::Hold();
  EXPECT_EQ(budget.held_by("rank 0"), 0);
  EXPECT_EQ(budget.total(), 2);
  EXPECT_TRUE(budget.Take("rank 0", 3).ok());
}

TEST(PeerBudgetTest, AHoldOutlivesItsBudget) {
  PeerBudget::Hold hold;
  {
    PeerBudget budget("bytes in flight", 100, "", 100, "max_bytes_in_flight_per_peer");
    hold = *budget.Take("ipv4:127.0.0.1", 60);
  }
  hold.Release();  // the budget's state lives while a hold does
}

TEST(JoinRateTest, ABurstThenTheRateNamingTheFlag) {
  FakeClock clock;
  JoinRate rate(/*per_second=*/2, /*world_size=*/3, &clock);  // burst: max(2, 2 x 3) = 6
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(rate.Take().ok()) << i;
  absl::Status refused = rate.Take();
  ASSERT_TRUE(absl::IsResourceExhausted(refused));
  EXPECT_TRUE(absl::StrContains(refused.message(), "--join_rate")) << refused;
  clock.Advance(absl::Milliseconds(500));  // one more token at 2 per second
  EXPECT_TRUE(rate.Take().ok());
  EXPECT_FALSE(rate.Take().ok());
  clock.Advance(absl::Hours(1));  // refills to the burst, no further
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(rate.Take().ok()) << i;
  EXPECT_FALSE(rate.Take().ok());
}

TEST(LimitsTest, PeerKeysAreRanksOrAddressesWithoutPorts) {
  EXPECT_EQ(PeerKey(3, "ipv4:127.0.0.1:5555"), "rank 3");
  EXPECT_EQ(PeerKey(-1, "ipv4:10.1.2.3:40000"), "ipv4:10.1.2.3");
  EXPECT_EQ(PeerKey(-1, "ipv6:[::1]:40000"), "ipv6:[::1]");
  EXPECT_EQ(PeerKey(-1, "unix:/tmp/s"), "unix:/tmp/s");
}

TEST(LimitsTest, ValidationNamesTheFlag) {
  LimitOptions l;
  EXPECT_TRUE(ValidateLimits(l, 4 << 20).ok());
  l.max_parked_calls_per_peer = 0;
  EXPECT_TRUE(absl::StrContains(ValidateLimits(l, 4 << 20).message(), "--max_parked_calls_per_peer"));
  l = LimitOptions();
  l.max_message_bytes = 4 << 20;  // no room for the envelope of a 4 MiB partition
  EXPECT_TRUE(absl::StrContains(ValidateLimits(l, 4 << 20).message(), "--max_message_bytes"));
  l.max_message_bytes = 8 << 20;
  EXPECT_TRUE(ValidateLimits(l, 4 << 20).ok());
  EXPECT_FALSE(ValidateLimits(l, 16 << 20).ok());  // partitions bigger than the messages
  l = LimitOptions();
  l.join_rate = 0;
  EXPECT_TRUE(absl::StrContains(ValidateLimits(l, 4 << 20).message(), "--join_rate"));
  l = LimitOptions();
  l.max_data_plane_connections_in_hello_per_source = 0;
  EXPECT_EQ(ValidateLimits(l, 4 << 20).message(),
            "--max_data_plane_connections_in_hello_per_source must be at least 1, got 0");
  l = LimitOptions();
  l.data_plane_hello_timeout = absl::ZeroDuration();
  EXPECT_EQ(ValidateLimits(l, 4 << 20).message(), "--data_plane_hello_timeout must be positive, got 0");
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

AllReduceContribution Contribution(const std::string& name, int rank, int group, const std::string& data,
                                   const std::string& peer = "ipv4:10.0.0.1") {
  AllReduceContribution c;
  c.name = name;
  c.group_size = group;
  c.rank = rank;
  c.spec = {"t", DType::kFloat32, {static_cast<int64_t>(data.size() / 4)}};
  c.data = data;
  c.peer = peer;
  return c;
}

// Completes a one-rank round of `name`: the collective is then idle.
void Complete(AllReduceHub& hub, const std::string& name, const std::string& data) {
  auto call = std::make_shared<FakeCall>();
  hub.Contribute(Contribution(name, 0, 1, data), call);
  ASSERT_TRUE(call->Wait().ok());
}

TEST(AllReduceLimitsTest, IdleCollectivesAreForgottenLeastRecentlyUsedFirst) {
  FakeClock clock;
  LimitOptions limits;
  limits.max_collectives = 3;
  AllReduceHub hub(absl::Seconds(30), &clock, nullptr, limits);
  const std::string data = Bytes({1, 2});
  for (const char* name : {"a", "b", "c"}) {
    Complete(hub, name, data);
    clock.Advance(absl::Seconds(1));
  }
  Complete(hub, "a", data);  // "a" used again: "b" is now the least recently used
  clock.Advance(absl::Seconds(1));
  Complete(hub, "d", data);
  EXPECT_EQ(hub.collectives(), 3u);
  EXPECT_EQ(hub.buffer_bytes(), 3 * 8);  // each keeps one buffer of two floats

  // "b" was forgotten: a 2-rank round under that name starts afresh; "a" kept its group size of
  // 1, so a caller saying 2 is refused.
  clock.Advance(absl::Seconds(1));
  auto b = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("b", 0, 2, data), b);
  EXPECT_FALSE(b->answered());  // waits for rank 1: "c" (least recently used, idle) made room
  auto a = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("a", 0, 2, data), a);
  ASSERT_TRUE(a->answered());
  EXPECT_TRUE(absl::IsInvalidArgument(a->Wait())) << a->Wait();
  auto b1 = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("b", 1, 2, data), b1);
  ASSERT_TRUE(b->Wait().ok());
  EXPECT_EQ(b->values(), (std::vector<float>{2, 4}));
}

TEST(AllReduceLimitsTest, CollectivesWithRoundsInProgressAreNeverForgotten) {
  FakeClock clock;
  LimitOptions limits;
  limits.max_collectives = 2;
  AllReduceHub hub(absl::Seconds(30), &clock, nullptr, limits);
  const std::string data = Bytes({1});
  std::vector<std::shared_ptr<FakeCall>> waiting;
  for (const char* name : {"x", "y"}) {
    waiting.push_back(std::make_shared<FakeCall>());
    hub.Contribute(Contribution(name, 0, 2, data), waiting.back());
  }
  auto refused = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("z", 0, 2, data), refused);
  const absl::Status s = refused->Wait();
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_collectives")) << s;
  // The rounds in progress were untouched: they complete.
  for (const char* name : {"x", "y"}) {
    auto second = std::make_shared<FakeCall>();
    hub.Contribute(Contribution(name, 1, 2, data), second);
    ASSERT_TRUE(second->Wait().ok());
  }
  for (auto& w : waiting) EXPECT_TRUE(w->Wait().ok());
}

TEST(AllReduceLimitsTest, BufferBytesAreBoundedIdleOnesGoingFirst) {
  FakeClock clock;
  LimitOptions limits;
  limits.max_allreduce_bytes = 100;
  AllReduceHub hub(absl::Seconds(30), &clock, nullptr, limits);
  const std::string forty(40, '\0');  // ten floats
  Complete(hub, "idle", forty);
  auto open = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("open", 0, 2, forty), open);
  EXPECT_EQ(hub.buffer_bytes(), 80);
  // 40 more would pass 100: the idle collective is forgotten to make room.
  auto next = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("next", 0, 2, forty), next);
  EXPECT_FALSE(next->answered());
  EXPECT_EQ(hub.buffer_bytes(), 80);
  EXPECT_EQ(hub.collectives(), 2u);
  // Nothing idle is left: a fourth is refused, naming the flag.
  auto refused = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("more", 0, 2, forty), refused);
  const absl::Status s = refused->Wait();
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_allreduce_bytes")) << s;
  hub.Shutdown();
}

TEST(AllReduceLimitsTest, APeerHoldsAtMostItsShareOfOpenRounds) {
  FakeClock clock;
  LimitOptions limits;
  limits.max_open_collectives_per_peer = 2;
  AllReduceHub hub(absl::Minutes(1), &clock, nullptr, limits);
  const std::string data = Bytes({1});
  std::vector<std::shared_ptr<FakeCall>> calls;
  for (const char* name : {"p", "q", "r"}) {
    calls.push_back(std::make_shared<FakeCall>());
    hub.Contribute(Contribution(name, 0, 2, data, "ipv4:10.0.0.66"), calls.back());
  }
  const absl::Status s = calls[2]->Wait();
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_open_collectives_per_peer")) << s;
  // Another peer opens rounds of its own; joining a round someone else opened costs nothing.
  auto other = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("s", 0, 2, data, "ipv4:10.0.0.7"), other);
  EXPECT_FALSE(other->answered());
  auto joins = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("p", 1, 2, data, "ipv4:10.0.0.7"), joins);
  ASSERT_TRUE(joins->Wait().ok());
  // "p" completed, giving its opener's share back; an abandoned round gives it back too.
  auto again = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("r", 0, 2, data, "ipv4:10.0.0.66"), again);
  EXPECT_FALSE(again->answered());
  clock.Advance(absl::Minutes(2));
  hub.ExpireRounds(clock.Now());
  EXPECT_TRUE(absl::IsDeadlineExceeded(again->Wait()));
  auto after = std::make_shared<FakeCall>();
  hub.Contribute(Contribution("t", 0, 2, data, "ipv4:10.0.0.66"), after);
  EXPECT_FALSE(after->answered());
  hub.Shutdown();
}

}  // namespace
}  // namespace summa::server
