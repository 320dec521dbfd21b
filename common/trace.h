// Tracer: a timeline of what a process spent its time on, written as Chrome trace JSON
// (chrome://tracing and https://ui.perfetto.dev open it). Each event is a complete span ("ph":
// "X") with a name (compute, push, wait, pull, sum, optimizer, ...), a category, the partition
// it concerns (or none), and the thread it ran on. Timestamps are microseconds of the Unix epoch,
// so the files of a server and its workers line up when loaded together.
//
// Recording is a short append under a mutex (a leaf lock: it may be taken under any other);
// events are kept in memory (at most kMaxEvents; the rest are counted and dropped) and written by
// Close or the destructor, atomically (temporary file, rename). Thread-safe. A null Tracer* means
// tracing is off: TraceSpan and the Record helpers then do nothing.
#ifndef SUMMA_COMMON_TRACE_H_
#define SUMMA_COMMON_TRACE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace summa {

class Tracer {
 public:
  static constexpr size_t kMaxEvents = 4 << 20;

  // Checks that `path` can be written (the file is created at once) and starts recording.
  // `process` names the process in the viewer ("summa-server", "summa-worker rank 1").
  static absl::StatusOr<std::unique_ptr<Tracer>> Open(const std::string& path, std::string process);
  ~Tracer();

  // Records a span. `name` and `category` must be string literals (or otherwise outlive the
  // tracer); `partition` < 0 means none.
  void Complete(const char* name, const char* category, absl::Time start, absl::Time end,
                int64_t partition = -1);

  // Writes the file; later events are dropped. Idempotent.
  absl::Status Close();

  size_t events() const;

 private:
  struct Event {
    const char* name;
    const char* category;
    int64_t start_ns;
    int64_t duration_ns;
    int64_t partition;
    int thread;
  };
  Tracer(std::string path, std::string process) : path_(std::move(path)), process_(std::move(process)) {}

  const std::string path_;
  const std::string process_;
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// Records the span from its construction to its destruction, when `tracer` is not null.
class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, const char* name, const char* category, int64_t partition = -1)
      : tracer_(tracer), name_(name), category_(category), partition_(partition),
        start_(tracer != nullptr ? absl::Now() : absl::InfinitePast()) {}
  ~TraceSpan() {
    if (tracer_ != nullptr) tracer_->Complete(name_, category_, start_, absl::Now(), partition_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* const tracer_;  // Not owned; may be null.
  const char* const name_;
  const char* const category_;
  const int64_t partition_;
  const absl::Time start_;
};

}  // namespace summa

#endif  // SUMMA_COMMON_TRACE_H_
