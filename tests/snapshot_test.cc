#include "server/core/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace summa::server {
namespace {

Snapshot Filled(SnapshotPool& pool, int64_t n, float value) {
  float* data;
  Snapshot s = pool.Acquire(n, &data);
  std::fill(data, data + n, value);
  return s;
}

TEST(SnapshotPoolTest, ABufferIsReusedOnlyOnceEveryReaderHasLetGo) {
  SnapshotPool pool;
  Snapshot first = Filled(pool, 4, 1.0f);
  Snapshot reader = first;          // a reply holding it
  void* sending = first.Lend();     // gRPC sending it
  first = Snapshot();
  reader = Snapshot();
  // Still being sent: the next snapshot gets a buffer of its own, and the first keeps its values.
  Snapshot second = Filled(pool, 4, 2.0f);
  EXPECT_EQ(pool.size(), 2u);
  second = Snapshot();
  Snapshot::Return(sending);
  // Both free now: no new buffer.
  Snapshot third = Filled(pool, 4, 3.0f);
  Snapshot fourth = Filled(pool, 4, 4.0f);
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_EQ(third.values()[0], 3.0f);
  EXPECT_EQ(fourth.values()[0], 4.0f);
}

TEST(SnapshotPoolTest, ValuesHeldByAReaderAreNeverOverwritten) {
  SnapshotPool pool;
  Snapshot held = Filled(pool, 3, 7.0f);
  for (int i = 0; i < 10; ++i) Filled(pool, 3, float(i));  // each dropped at once
  EXPECT_EQ(std::vector<float>(held.values().begin(), held.values().end()), std::vector<float>(3, 7.0f));
  EXPECT_EQ(pool.size(), 2u);
}

TEST(SnapshotPoolTest, StepsInSteadyStateAllocateNothing) {
  // One version published and sent while the next is filled, as a partition does every step.
  SnapshotPool pool;
  Snapshot published = Filled(pool, 1000, 0.0f);
  for (int step = 1; step <= 100; ++step) {
    void* in_flight = published.Lend();
    published = Filled(pool, 1000, float(step));
    Snapshot::Return(in_flight);
  }
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_EQ(published.values()[999], 100.0f);
}

TEST(SnapshotTest, AHandleOutlivesItsPool) {
  Snapshot kept;
  {
    SnapshotPool pool;
    kept = Filled(pool, 2, 5.0f);
  }
  EXPECT_EQ(kept.values()[1], 5.0f);
}

TEST(SnapshotTest, AVersionIsEncodedOnceForEveryReplyAndAReusedBufferIsEncodedAfresh) {
  SnapshotPool pool;
  Snapshot first = Filled(pool, 3, 1.5f);
  const absl::Span<const uint16_t> a = first.Encoded(WireDType::kBfloat16);
  EXPECT_EQ(std::vector<uint16_t>(a.begin(), a.end()), std::vector<uint16_t>(3, 0x3fc0));
  EXPECT_EQ(first.Encoded(WireDType::kBfloat16).data(), a.data());  // shared, not made again
  const absl::Span<const uint16_t> h = first.Encoded(WireDType::kFloat16);
  EXPECT_EQ(std::vector<uint16_t>(h.begin(), h.end()), std::vector<uint16_t>(3, 0x3e00));
  EXPECT_TRUE(first.Encoded(WireDType::kFloat32).empty());  // float32 is values()
  first = Snapshot();
  // The pool hands the buffer out again with new values: its encoding is of those.
  Snapshot second = Filled(pool, 3, -2.0f);
  const absl::Span<const uint16_t> b = second.Encoded(WireDType::kBfloat16);
  EXPECT_EQ(std::vector<uint16_t>(b.begin(), b.end()), std::vector<uint16_t>(3, 0xc000));
  // ... in either dtype (both were made for the first values).
  const absl::Span<const uint16_t> g = second.Encoded(WireDType::kFloat16);
  EXPECT_EQ(std::vector<uint16_t>(g.begin(), g.end()), std::vector<uint16_t>(3, 0xc000));
}

}  // namespace
TEST(SnapshotPoolTest, ALargeBufferOfASharingProcessIsASegmentThatIsSentReadOnlyAndCannotBeWritten) {
  SnapshotPool pool;
  float* small_data;
  const Snapshot small = pool.Acquire(Snapshot::kSharedBytes / sizeof(float) - 1, &small_data);
  Snapshot::SharedView view;
  Snapshot::ShareLargeBuffers();
  float* data;
  const int64_t n = Snapshot::kSharedBytes / sizeof(float);
  const Snapshot big = pool.Acquire(n, &data);
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i);
  EXPECT_FALSE(Snapshot::FindShared(small_data, 4, &view)) << "a buffer made before sharing, and small";
  ASSERT_TRUE(Snapshot::FindShared(data + 10, 40, &view));
  EXPECT_EQ(view.offset, 40u);
  EXPECT_GE(view.segment_bytes, static_cast<uint64_t>(n * sizeof(float)));
  EXPECT_FALSE(Snapshot::FindShared(data + n - 1, 8, &view)) << "bytes past the buffer's";
  ASSERT_TRUE(Snapshot::FindShared(data, 4, &view));
  // The descriptor a worker gets reads, and nothing else, however it is opened again.
  EXPECT_EQ(::fcntl(view.fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  void* read = ::mmap(nullptr, view.segment_bytes, PROT_READ, MAP_SHARED, view.fd, 0);
  ASSERT_NE(read, MAP_FAILED);
  EXPECT_EQ(static_cast<const float*>(read)[7], 7.0f);
  ::munmap(read, view.segment_bytes);
  EXPECT_EQ(::mmap(nullptr, view.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, view.fd, 0), MAP_FAILED);
  const std::string again = "/proc/self/fd/" + std::to_string(view.fd);
  const int writable = ::open(again.c_str(), O_RDWR | O_CLOEXEC);
  if (writable >= 0) {
    EXPECT_EQ(::mmap(nullptr, view.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, writable, 0), MAP_FAILED);
    EXPECT_LT(::write(writable, "x", 1), 0);
    ::close(writable);
  }
}

}  // namespace summa::server
