#include "common/flags.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace summa {
namespace {
bool IsOurs(absl::string_view file) { return !absl::StrContains(file, "absl/"); }
}  // namespace

void ParseFlagsOrDie(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsOurs;
  config.contains_help_flags = IsOurs;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument '%s' (flags look like --name=value; see --help)\n",
                 argv[0], rest[1]);
    std::exit(2);
  }
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  const bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal(absl::Duration timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec wait = absl::ToTimespec(timeout);
  const int sig = sigtimedwait(&set, nullptr, &wait);
  return sig > 0 ? sig : 0;
}

}  // namespace summa
