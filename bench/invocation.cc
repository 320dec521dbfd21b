#include "bench/invocation.h"

#include <limits.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace summa::bench {

std::string ShellQuote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789-_=./,:@+%") == std::string::npos) {
    return arg;
  }
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> words;
  for (int i = 0; i < argc; ++i) words.push_back(ShellQuote(argv[i]));
  return absl::StrJoin(words, " ");
}

std::string DescribeEnvironment() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  utsname un = {};
  ::uname(&un);
  const double load_average = LoadAverage();
  const std::string load = load_average < 0 ? "?" : absl::StrFormat("%.2f", load_average);
  return absl::StrCat("Environment: ", cores, " cores (nproc), ", un.sysname, " ", un.release, " ",
                      un.machine, ", load average ", load, " at start, ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::Now(), absl::LocalTimeZone()));
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : std::string();
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace summa::bench
