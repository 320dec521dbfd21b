// Minimal leveled logging to stderr: `SUMMA_LOG(INFO) << "joined rank " << r;`.
// Thread-safe: each statement is written with one write call.
#ifndef SUMMA_COMMON_LOGGING_H_
#define SUMMA_COMMON_LOGGING_H_

#include <sstream>

namespace summa {

enum class LogSeverity { kInfo, kWarning, kError };

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Messages below this severity are dropped (default kInfo).
void SetMinLogSeverity(LogSeverity severity);

}  // namespace summa

#define SUMMA_LOG_SEVERITY_INFO ::summa::LogSeverity::kInfo
#define SUMMA_LOG_SEVERITY_WARNING ::summa::LogSeverity::kWarning
#define SUMMA_LOG_SEVERITY_ERROR ::summa::LogSeverity::kError
#define SUMMA_LOG(level) \
  ::summa::LogMessage(SUMMA_LOG_SEVERITY_##level, __FILE__, __LINE__).stream()

#endif  // SUMMA_COMMON_LOGGING_H_
