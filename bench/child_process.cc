#include "bench/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

extern char** environ;

namespace summa::bench {
namespace {

std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is set in a signal handler");

void OnStopSignal(int signal) { stop_signal.store(signal); }

// How long one poll or sleep lasts at most, so that a stop request is seen promptly.
constexpr absl::Duration kSlice = absl::Milliseconds(20);

absl::Status StoppedError() {
  return absl::CancelledError(absl::StrCat("stopped by ", strsignal(StopSignal())));
}

std::string ErrnoText(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// NAME=VALUE strings: ours, with `overrides` replacing or adding entries.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const bool replaced = std::any_of(overrides.begin(), overrides.end(), [&](const auto& o) {
      return absl::StartsWith(entry, absl::StrCat(o.first, "="));
    });
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : overrides) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

void InstallStopHandler() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int StopSignal() { return stop_signal.load(); }

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no command to start");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = options.argv;
  std::vector<std::string> env = ChildEnvironment(options.env);
  std::vector<char*> argv = CStrings(args);
  std::vector<char*> envp = CStrings(env);

  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int log_fd = ::open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int out_pipe[2] = {-1, -1};
  int exec_error_pipe[2] = {-1, -1};  // carries errno when exec fails; closed by a good exec
  auto close_all = [&] {
    for (int fd : {null_fd, log_fd, out_pipe[0], out_pipe[1], exec_error_pipe[0], exec_error_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
  };
  if (null_fd < 0 || log_fd < 0 || (options.capture_stdout && ::pipe2(out_pipe, O_CLOEXEC) != 0) ||
      ::pipe2(exec_error_pipe, O_CLOEXEC) != 0) {
    absl::Status error = absl::InternalError(
        ErrnoText(absl::StrCat("cannot prepare ", options.name, " (log ", options.log_path, ")")));
    close_all();
    return error;
  }

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    absl::Status error = absl::InternalError(ErrnoText(absl::StrCat("cannot fork ", options.name)));
    close_all();
    return error;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the driver died before prctl
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(options.capture_stdout ? out_pipe[1] : log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    const int error = errno;
    (void)!::write(exec_error_pipe[1], &error, sizeof(error));
    ::_exit(127);
  }

  ::close(exec_error_pipe[1]);
  exec_error_pipe[1] = -1;
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_error_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  const int stdout_fd = out_pipe[0];
  out_pipe[0] = -1;
  close_all();
  auto child = std::unique_ptr<ChildProcess>(
      new ChildProcess(options.name, pid, stdout_fd, options.log_path));
  if (n > 0) {
    child->Kill();  // reaps it
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", options.name, " (", options.argv[0], "): ", std::strerror(exec_errno)));
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  Kill();
}

std::string ChildProcess::Describe() const { return absl::StrCat(name_, " (pid ", pid_, ")"); }

bool ChildProcess::Exited() {
  if (reaped_) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reaped_ = true;
    wait_status_ = status;
  }
  return reaped_;
}

std::string ChildProcess::ExitDescription() const {
  if (!reaped_) return "is still running";
  if (WIFEXITED(wait_status_)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status_), " (",
                        strsignal(WTERMSIG(wait_status_)), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status_);
}

bool ChildProcess::ExitedCleanly(int signal) const {
  if (!reaped_) return false;
  if (WIFEXITED(wait_status_)) return WEXITSTATUS(wait_status_) == 0;
  return signal != 0 && WIFSIGNALED(wait_status_) && WTERMSIG(wait_status_) == signal;
}

std::string ChildProcess::LogTail(int lines) const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return absl::StrCat("\n    (no log at ", log_path_, ")");
  constexpr std::streamoff kMaxTail = 64 << 10;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - kMaxTail));
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> all =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(text.str()), '\n', absl::SkipEmpty());
  if (all.empty()) return absl::StrCat("\n    (", log_path_, " is empty)");
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::string tail = absl::StrCat("\n    last lines of ", log_path_, ":");
  for (size_t i = first; i < all.size(); ++i) absl::StrAppend(&tail, "\n    | ", all[i]);
  return tail;
}

void ChildProcess::Kill() {
  if (Exited()) return;
  ::kill(pid_, SIGKILL);
  // SIGKILL cannot be caught; this wait is bounded only against a process stuck in the kernel.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!Exited() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(2));
  if (!reaped_) std::fprintf(stderr, "warning: %s did not die after SIGKILL\n", Describe().c_str());
}

absl::Status ChildProcess::Stop(absl::Duration grace) {
  if (!Exited()) {
    ::kill(pid_, SIGTERM);
    const absl::Time give_up = absl::Now() + grace;
    while (!Exited() && absl::Now() < give_up && StopSignal() == 0) absl::SleepFor(absl::Milliseconds(5));
    if (!reaped_) {
      Kill();
      if (StopSignal() != 0) return StoppedError();
      return absl::DeadlineExceededError(absl::StrCat(
          Describe(), " did not exit within ", absl::FormatDuration(grace), " of SIGTERM; killed"));
    }
  }
  if (!ExitedCleanly(SIGTERM)) {
    return absl::InternalError(absl::StrCat(Describe(), " ", ExitDescription(), LogTail()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<ChildProcess>>> StartAll(const std::vector<ChildOptions>& all) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (const ChildOptions& options : all) {
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child, ChildProcess::Start(options));
    children.push_back(std::move(child));
  }
  return children;
}

std::vector<ChildProcess*> Pointers(const std::vector<std::unique_ptr<ChildProcess>>& children) {
  std::vector<ChildProcess*> pointers;
  for (const auto& c : children) pointers.push_back(c.get());
  return pointers;
}

absl::Status RunToCompletion(
    absl::Span<ChildProcess* const> children, absl::Span<ChildProcess* const> must_stay_up,
    absl::Time deadline, std::vector<std::string>* outputs,
    const std::function<void(const std::vector<std::string>&)>& on_output) {
  outputs->assign(children.size(), "");
  std::vector<char> buffer(64 << 10);
  for (;;) {
    if (StopSignal() != 0) return StoppedError();
    // A child that failed ends the wait at once: its peers would wait for it until the deadline.
    bool all_done = true;
    for (ChildProcess* c : children) {
      if (c->Exited() && !c->ExitedCleanly()) {
        return absl::InternalError(absl::StrCat(c->Describe(), " ", c->ExitDescription(), c->LogTail()));
      }
      all_done = all_done && c->stdout_fd_ < 0 && c->reaped_;
    }
    if (all_done) return absl::OkStatus();
    for (ChildProcess* s : must_stay_up) {
      if (s->Exited()) {
        return absl::UnavailableError(absl::StrCat(s->Describe(), " ", s->ExitDescription(),
                                                   " while its clients were running", s->LogTail()));
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::vector<std::string> late;
      for (ChildProcess* c : children) {
        if (!c->reaped_) late.push_back(c->Describe());
      }
      return absl::DeadlineExceededError(
          absl::StrCat(absl::StrJoin(late, ", "), " did not finish in time"));
    }

    std::vector<pollfd> fds;
    std::vector<ChildProcess*> readers;
    for (ChildProcess* c : children) {
      if (c->stdout_fd_ >= 0) {
        fds.push_back({c->stdout_fd_, POLLIN, 0});
        readers.push_back(c);
      }
    }
    const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(std::min(deadline - now, kSlice))) + 1;
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
      return absl::InternalError(ErrnoText("poll"));
    }
    bool more = false;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      ChildProcess* c = readers[i];
      const ssize_t n = ::read(c->stdout_fd_, buffer.data(), buffer.size());
      if (n > 0) {
        const size_t index = std::find(children.begin(), children.end(), c) - children.begin();
        (*outputs)[index].append(buffer.data(), n);
        more = true;
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(c->stdout_fd_);
        c->stdout_fd_ = -1;
      }
    }
    if (more && on_output) on_output(*outputs);
  }
}

absl::StatusOr<std::string> WaitForFile(const std::string& path, ChildProcess& writer,
                                        absl::Time deadline) {
  for (;;) {
    if (StopSignal() != 0) return StoppedError();
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !absl::StripAsciiWhitespace(line).empty()) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
    if (writer.Exited()) {
      return absl::UnavailableError(absl::StrCat(writer.Describe(), " ", writer.ExitDescription(),
                                                 " before writing ", path, writer.LogTail()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(writer.Describe(), " did not write ", path, " in time"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::StatusOr<int64_t> PeakRssBytes(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  std::string line;
  while (in && std::getline(in, line)) {
    absl::string_view kb = line;
    if (!absl::ConsumePrefix(&kb, "VmHWM:")) continue;
    kb = absl::StripAsciiWhitespace(kb);
    absl::ConsumeSuffix(&kb, "kB");
    int64_t value = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(kb), &value)) return value * 1024;
  }
  return absl::NotFoundError(absl::StrCat("no VmHWM line in ", path));
}

absl::StatusOr<int64_t> ProcStatField(pid_t pid, int field) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  std::string stat;
  if (!in || !std::getline(in, stat)) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const size_t close = stat.rfind(')');
  if (field < 3 || close == std::string::npos || close + 2 > stat.size()) {
    return absl::DataLossError(absl::StrCat(path, " has no field ", field));
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  int64_t value = 0;
  const size_t index = static_cast<size_t>(field - 3);
  if (index >= fields.size() || !absl::SimpleAtoi(fields[index], &value)) {
    return absl::DataLossError(absl::StrCat(path, " has no field ", field));
  }
  return value;
}

absl::StatusOr<double> CpuSeconds(pid_t pid) {
  absl::StatusOr<int64_t> user = ProcStatField(pid, 14);
  if (!user.ok()) return user.status();
  absl::StatusOr<int64_t> system = ProcStatField(pid, 15);
  if (!system.ok()) return system.status();
  return static_cast<double>(*user + *system) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace summa::bench
