#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace summa {
namespace {
std::atomic<int> min_severity{0};

const char* Letter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo: return "I";
    case LogSeverity::kWarning: return "W";
    case LogSeverity::kError: return "E";
  }
  return "?";
}
}  // namespace

void SetMinLogSeverity(LogSeverity severity) { min_severity = static_cast<int>(severity); }

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) {
  if (static_cast<int>(severity) < min_severity.load()) {
    stream_.setstate(std::ios::badbit);
    return;
  }
  const char* base = std::strrchr(file, '/');
  stream_ << Letter(severity)
          << absl::FormatTime("%m%d %H:%M:%E3S ", absl::Now(), absl::LocalTimeZone())
          << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (stream_.bad()) return;
  stream_ << '\n';
  const std::string text = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace summa
