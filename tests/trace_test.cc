#include "common/trace.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace summa {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(TracerTest, SpansFromEveryThreadAreWrittenAsChromeTraceEvents) {
  const std::string path = ::testing::TempDir() + "/trace_test.json";
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Open(path, "test \"process\"");
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        TraceSpan span(tracer->get(), "sum", "server", t);
      }
    });
  }
  for (auto& t : threads) t.join();
  const absl::Time start = absl::FromUnixMicros(1'000'000);
  (*tracer)->Complete("compute", "worker", start, start + absl::Microseconds(2500));
  TraceSpan off(nullptr, "ignored", "none");  // a null tracer records nothing
  EXPECT_EQ((*tracer)->events(), 31u);
  ASSERT_TRUE((*tracer)->Close().ok());
  (*tracer)->Complete("late", "worker", start, start);  // after Close: dropped
  const std::string json = Read(path);
  EXPECT_EQ(Count(json, "\"ph\": \"X\""), 31) << json;
  EXPECT_EQ(Count(json, "\"name\": \"sum\""), 30);
  EXPECT_EQ(Count(json, "\"args\": {\"partition\": 2}"), 10);
  EXPECT_NE(json.find("\"name\": \"compute\", \"cat\": \"worker\", \"ph\": \"X\", \"ts\": 1000000.000, \"dur\": 2500.000"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"args\": {\"name\": \"test \\\"process\\\"\"}"), std::string::npos) << json;
  EXPECT_EQ(json.find("late"), std::string::npos);
  EXPECT_EQ(json.find("ignored"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TracerTest, AnUnwritablePathIsRefusedAtOnce) {
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Open("/nonexistent/dir/trace.json", "x");
  EXPECT_EQ(tracer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tracer.status().message().find("/nonexistent/dir/trace.json"), absl::string_view::npos);
}

}  // namespace
}  // namespace summa
