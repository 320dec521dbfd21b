// How a benchmark was run, as its report states it: the command line (shell-quoted, so that it
// can be pasted back), the machine and its load, and where the benchmark's own binary is.
// Plain functions; thread-safe.
#ifndef SUMMA_BENCH_INVOCATION_H_
#define SUMMA_BENCH_INVOCATION_H_

#include <string>

namespace summa::bench {

// `arg` quoted for a POSIX shell when it needs to be.
std::string ShellQuote(const std::string& arg);
// argv as one line a shell would run again.
std::string CommandLine(int argc, char** argv);
// "Environment: 2 cores (nproc), Linux 6.1 x86_64, load average 0.52 at start, <date>".
std::string DescribeEnvironment();
// The 1-minute load average (/proc/loadavg), or -1 when it cannot be read.
double LoadAverage();
// This process's executable (/proc/self/exe), or "".
std::string SelfPath();
// The first executable named `name` on PATH, or "".
std::string FindOnPath(const std::string& name);

}  // namespace summa::bench

#endif  // SUMMA_BENCH_INVOCATION_H_
