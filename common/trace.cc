#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"

namespace summa {
namespace {

int ThreadId() {
  thread_local const int id = static_cast<int>(::syscall(SYS_gettid));
  return id;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tracer>> Tracer::Open(const std::string& path, std::string process) {
  std::ofstream probe(path, std::ios::trunc);
  if (!probe) return absl::InvalidArgumentError(absl::StrCat("--trace_file ", path, ": cannot write"));
  probe << "{\"traceEvents\": []}\n";  // a valid, empty trace until Close writes the real one
  auto t = std::unique_ptr<Tracer>(new Tracer(path, std::move(process)));
  absl::MutexLock lock(&t->mu_);
  t->events_.reserve(1 << 16);
  return t;
}

Tracer::~Tracer() { Close().IgnoreError(); }

void Tracer::Complete(const char* name, const char* category, absl::Time start, absl::Time end,
                      int64_t partition) {
  const Event e{name, category, absl::ToUnixNanos(start), absl::ToInt64Nanoseconds(end - start), partition,
                ThreadId()};
  absl::MutexLock lock(&mu_);
  if (closed_ || events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

size_t Tracer::events() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

absl::Status Tracer::Close() {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::OkStatus();
  closed_ = true;
  std::ostringstream out;
  {
    const int pid = static_cast<int>(::getpid());
    out << "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"dropped_events\": " << dropped_ << "},\n"
        << "\"traceEvents\": [\n"
        << absl::StrFormat(R"({"name": "process_name", "ph": "M", "pid": %d, "args": {"name": %s}})", pid,
                           JsonString(process_));
    for (const Event& e : events_) {
      out << ",\n"
          << absl::StrFormat(R"({"name": "%s", "cat": "%s", "ph": "X", "ts": %.3f, "dur": %.3f, "pid": %d, "tid": %d)",
                             e.name, e.category, e.start_ns / 1e3, e.duration_ns / 1e3, pid, e.thread);
      if (e.partition >= 0) out << ", \"args\": {\"partition\": " << e.partition << "}";
      out << "}";
    }
    out << "\n]}\n";
  }
  absl::Status written = WriteFileAtomically(path_, out.str());
  if (!written.ok()) return absl::UnavailableError(absl::StrCat("cannot write the trace: ", written.message()));
  return absl::OkStatus();
}

}  // namespace summa
