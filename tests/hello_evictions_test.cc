// Which connection in its hello a newcomer to the socket data plane evicts
// (server/rpc/hello_evictions.h), between sources that the plane's own tests, all on 127.0.0.1,
// cannot make.
#include "server/rpc/hello_evictions.h"

#include <cstddef>
#include <optional>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

// PickHelloEviction over `sources` (oldest first) for a newcomer from `source`, with the
// connections in `silent` having sent nothing; the indices it asked about land in `asked`.
std::optional<HelloEviction> Pick(const std::vector<absl::string_view>& sources, absl::string_view source,
                                  HelloBounds bounds, const std::set<size_t>& silent = {},
                                  std::vector<size_t>* asked = nullptr) {
  return PickHelloEviction(sources, source, bounds, [&](size_t i) {
    if (asked != nullptr) asked->push_back(i);
    return silent.count(i) > 0;
  });
}

TEST(HelloEvictionsTest, NoneWhileBothBoundsHaveRoom) {
  EXPECT_FALSE(Pick({}, "a", {1, 1}).has_value());
  EXPECT_FALSE(Pick({"a", "b", "a"}, "a", {4, 3}).has_value());
  EXPECT_FALSE(Pick({"a", "b", "a"}, "c", {4, 1}).has_value());  // b and a are past 1, but c is not
}

TEST(HelloEvictionsTest, PastItsSourcesBoundTheSourcesOldestSilentConnectionGoes) {
  std::vector<size_t> asked;
  std::optional<HelloEviction> e = Pick({"a", "b", "a", "a", "a"}, "a", {10, 4}, {1, 3, 4}, &asked);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 3u);  // not 0 or 2, which have spoken; not 1, another source's
  EXPECT_EQ(e->bound, HelloBound::kPerSource);
  EXPECT_TRUE(e->silent);
  // Only the source's own were asked, oldest first, up to the first silent one.
  EXPECT_EQ(asked, (std::vector<size_t>{0, 2, 3}));
}

TEST(HelloEvictionsTest, WhereNoneIsSilentTheOldestGoes) {
  std::optional<HelloEviction> e = Pick({"b", "a", "a"}, "a", {10, 2});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 1u);
  EXPECT_EQ(e->bound, HelloBound::kPerSource);
  EXPECT_FALSE(e->silent);
}

TEST(HelloEvictionsTest, PastTheTotalTheSourceHoldingTheMostGivesOneUp) {
  // c holds the most; the newcomer's own source (a) holds one and is within its bound.
  std::optional<HelloEviction> e = Pick({"a", "c", "b", "c", "c", "b"}, "a", {6, 5}, {4});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 4u);
  EXPECT_EQ(e->bound, HelloBound::kTotal);
  // A newcomer from a new source, with none silent: c's oldest.
  e = Pick({"a", "c", "b", "c", "c", "b"}, "d", {6, 5});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 1u);
  // Between sources holding equally many, the one whose oldest is oldest (b here).
  e = Pick({"b", "a", "a", "b"}, "d", {4, 5});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 0u);
}

TEST(HelloEvictionsTest, TheNewcomersOwnSourcePastItsBoundGoesFirst) {
  // Both bounds are reached; b holds the most, but a is past its own bound: a gives one up.
  std::optional<HelloEviction> e = Pick({"b", "a", "b", "b"}, "a", {4, 1}, {0, 2, 3});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->index, 1u);
  EXPECT_EQ(e->bound, HelloBound::kPerSource);
}

TEST(HelloEvictionsTest, EvictingOneAtATimeBringsBothBoundsWithin) {
  // Bounds lowered under a full table (or a burst): as many evictions as the excess, no more.
  std::vector<absl::string_view> sources = {"a", "b", "a", "c", "a", "b", "a"};
  int evicted = 0;
  while (std::optional<HelloEviction> e = Pick(sources, "a", {4, 2})) {
    sources.erase(sources.begin() + static_cast<std::ptrdiff_t>(e->index));
    ++evicted;
    ASSERT_LE(evicted, 7);
  }
  // Each bound less the newcomer's place: a keeps one (its three oldest go), and of the four
  // left, the total keeps three (b, which then holds the most, gives up its oldest).
  EXPECT_EQ(sources, (std::vector<absl::string_view>{"c", "b", "a"}));
  EXPECT_EQ(evicted, 4);
}

}  // namespace
}  // namespace summa::server
