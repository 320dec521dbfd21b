// ChildProcess: a process the benchmark driver starts with fork/exec and owns by its PID. Its
// stdout can be captured through a pipe, its stderr goes to a log file. Every wait takes a
// deadline and gives up early when the driver has been asked to stop (SIGINT/SIGTERM, see
// InstallStopHandler). Destroying a ChildProcess that has not been reaped kills it (SIGKILL, by
// PID) and reaps it, so every path out of the driver, errors included, leaves no child behind.
// The child also gets PR_SET_PDEATHSIG, so it dies with a driver that is itself SIGKILLed.
// Not thread-safe.
#ifndef SUMMA_BENCH_CHILD_PROCESS_H_
#define SUMMA_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace summa::bench {

// Makes SIGINT and SIGTERM to this process set a flag instead of ending it; every wait below
// then returns CANCELLED, and the caller's destructors kill its children.
void InstallStopHandler();
// The signal that asked the driver to stop, or 0.
int StopSignal();

struct ChildOptions {
  std::string name;               // for people: "summa rank 1", "summa-server"
  std::vector<std::string> argv;  // argv[0] is the path executed
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) ours
  std::string log_path;           // stderr (and stdout unless captured) go here
  bool capture_stdout = false;
};

class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ChildOptions& options);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  // "summa rank 1 (pid 1234)".
  std::string Describe() const;

  // Reaps the child if it has exited; returns whether it has.
  bool Exited();
  // The wait status once Exited() (waitpid's), and it in words ("exited with status 1").
  int wait_status() const { return wait_status_; }
  std::string ExitDescription() const;
  // Whether it exited with status 0, or was ended by `signal` (the one we sent to stop it).
  bool ExitedCleanly(int signal = 0) const;

  // The last `lines` lines of its log, indented, for error messages.
  std::string LogTail(int lines = 8) const;

  // Sends SIGTERM, waits up to `grace` for it to exit, then SIGKILLs it. OK when it exited
  // cleanly (status 0 or SIGTERM).
  absl::Status Stop(absl::Duration grace);

 private:
  friend absl::Status RunToCompletion(
      absl::Span<ChildProcess* const> children, absl::Span<ChildProcess* const> must_stay_up,
      absl::Time deadline, std::vector<std::string>* outputs,
      const std::function<void(const std::vector<std::string>&)>& on_output);
  ChildProcess(std::string name, pid_t pid, int stdout_fd, std::string log_path)
      : name_(std::move(name)), pid_(pid), stdout_fd_(stdout_fd), log_path_(std::move(log_path)) {}
  void Kill();

  const std::string name_;
  const pid_t pid_;
  int stdout_fd_;  // read end of the stdout pipe, or -1
  const std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// Starts every child; on an error the ones already started are killed as the vector goes away.
absl::StatusOr<std::vector<std::unique_ptr<ChildProcess>>> StartAll(const std::vector<ChildOptions>& all);

// The children as the plain pointers RunToCompletion takes.
std::vector<ChildProcess*> Pointers(const std::vector<std::unique_ptr<ChildProcess>>& children);

// Reads every child's captured stdout to its end and waits for each to exit, all before
// `deadline`. Fails with DEADLINE_EXCEEDED naming the children that did not finish, with
// UNAVAILABLE when one of `must_stay_up` (a server the children talk to) exits first, with
// INTERNAL when a child exits with a status other than 0 (naming it, with its log), and with
// CANCELLED when the driver is asked to stop. `outputs` receives each child's stdout, in order.
// `on_output`, when set, is called with every child's stdout so far each time more arrives.
absl::Status RunToCompletion(
    absl::Span<ChildProcess* const> children, absl::Span<ChildProcess* const> must_stay_up,
    absl::Time deadline, std::vector<std::string>* outputs,
    const std::function<void(const std::vector<std::string>&)>& on_output = nullptr);

// Waits until `path` holds a non-empty line written by `writer` (a server's --port_file) and
// returns that line; fails when the writer exits first, at the deadline, or when stopped.
absl::StatusOr<std::string> WaitForFile(const std::string& path, ChildProcess& writer,
                                        absl::Time deadline);

// The peak resident set size (VmHWM) of a live process, in bytes.
absl::StatusOr<int64_t> PeakRssBytes(pid_t pid);

// Field `field` of a live process's /proc/PID/stat, numbered as proc(5) numbers them (from 3 on:
// the ones after the command name, which may hold spaces).
absl::StatusOr<int64_t> ProcStatField(pid_t pid, int field);
// The CPU time a live process has used, user and system (utime + stime), in seconds; the
// kernel counts it in clock ticks (10 ms on most systems).
absl::StatusOr<double> CpuSeconds(pid_t pid);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_CHILD_PROCESS_H_
