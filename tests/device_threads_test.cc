// DeviceThreads runs one piece of work per device at once, on threads kept across rounds, and
// reports the first error in device order after every piece has run.
#include "worker/compute/device_threads.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace summa::worker {
namespace {

TEST(DeviceThreadsTest, EveryDeviceRunsOncePerRoundOnItsOwnThread) {
  DeviceThreads threads(3);
  std::vector<int> runs(3, 0);
  std::vector<std::thread::id> ids(3);
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(threads.Run([&](int d) {
      ++runs[d];
      ids[d] = std::this_thread::get_id();
      return absl::OkStatus();
    }).ok());
  }
  EXPECT_EQ(runs, std::vector<int>({50, 50, 50}));
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // device 0 on the caller
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[1]);
}

// The pieces overlap: each waits until all three have started. Run one after another, the first
// would wait alone until its deadline and fail.
TEST(DeviceThreadsTest, PiecesRunAtTheSameTime) {
  DeviceThreads threads(3);
  std::atomic<int> started{0};
  const absl::Status s = threads.Run([&](int d) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (started.load() < 3) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("device ", d, " waited 30 s for the others"));
      }
      std::this_thread::yield();
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(DeviceThreadsTest, TheFirstErrorInDeviceOrderAfterEveryPieceRan) {
  DeviceThreads threads(4);
  std::atomic<int> ran{0};
  const absl::Status s = threads.Run([&](int d) {
    ran.fetch_add(1);
    return d >= 2 ? absl::InternalError(absl::StrCat("device ", d)) : absl::OkStatus();
  });
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(s, absl::InternalError("device 2"));
  // And the next round runs normally.
  EXPECT_TRUE(threads.Run([](int) { return absl::OkStatus(); }).ok());
}

TEST(DeviceThreadsTest, OneDeviceRunsOnTheCaller) {
  DeviceThreads threads(1);
  std::thread::id id;
  ASSERT_TRUE(threads.Run([&](int d) {
    EXPECT_EQ(d, 0);
    id = std::this_thread::get_id();
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(id, std::this_thread::get_id());
}

}  // namespace
}  // namespace summa::worker
