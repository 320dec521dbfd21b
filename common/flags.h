// Flag parsing shared by the binaries: `--help` lists Summa's own flags (not Abseil's internals),
// and a bad flag or stray argument ends the program with a message and exit code 2.
#ifndef SUMMA_COMMON_FLAGS_H_
#define SUMMA_COMMON_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace summa {

void ParseFlagsOrDie(int argc, char** argv, const char* usage);

// Writes `content` to `path` atomically (temporary file, fsync, rename), so a reader polling for
// the file never sees half of it.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content);

// Blocks SIGINT and SIGTERM in this and every thread started later; call before starting threads.
void BlockTerminationSignals();
// Waits up to `timeout` for SIGINT or SIGTERM (blocked beforehand) and returns its number, or 0
// when none came.
int WaitForTerminationSignal(absl::Duration timeout);

}  // namespace summa

#endif  // SUMMA_COMMON_FLAGS_H_
