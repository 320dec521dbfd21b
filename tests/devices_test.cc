// Choosing backends from --device / --devices: every bad entry is refused with
// INVALID_ARGUMENT naming it, never a crash or an exception.
#include "worker/compute/devices.h"

#include "gtest/gtest.h"

namespace summa::worker {
namespace {

void ExpectRefused(const std::string& devices, const std::string& named) {
  absl::StatusOr<std::vector<std::unique_ptr<Backend>>> b = MakeBackends(devices, 1);
  ASSERT_FALSE(b.ok()) << devices;
  EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << devices << ": " << b.status();
  EXPECT_NE(b.status().message().find(named), std::string::npos) << devices << ": " << b.status();
}

TEST(DevicesTest, BadEntriesAreNamed) {
  ExpectRefused("gpu", "'gpu'");
  ExpectRefused("cuda:", "'cuda:'");
  ExpectRefused("cuda:x", "'cuda:x'");
  ExpectRefused("cuda:1x", "'cuda:1x'");
  ExpectRefused("cuda:-1", "'cuda:-1'");
  ExpectRefused("cuda:99999999999999999999", "'cuda:99999999999999999999'");
  ExpectRefused("cpu,cuda:zero", "'cuda:zero'");
  ExpectRefused("cpu,,cpu", "empty device in 'cpu,,cpu'");
  ExpectRefused("", "empty device");
}

TEST(DevicesTest, CpuListsMakeOneBackendEach) {
  absl::StatusOr<std::vector<std::unique_ptr<Backend>>> b = MakeBackends("cpu,cpu", 1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[1]->name(), "cpu");
  EXPECT_TRUE(absl::IsInvalidArgument(MakeBackends("cpu", 0).status()));
}

// --threads=3 on the CPU: three CPU backends (the shard split across three threads); a list
// keeps one backend per entry.
TEST(DevicesTest, CpuThreadsMakeOneBackendPerThread) {
  absl::StatusOr<std::vector<std::unique_ptr<Backend>>> b = MakeBackends("cpu", 3);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 3u);
  for (const auto& backend : *b) EXPECT_EQ(backend->name(), "cpu");
  b = MakeBackends("cpu,cpu", 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 2u);
}

}  // namespace
}  // namespace summa::worker
