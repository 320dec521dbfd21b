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
