// Flag parsing shared by the binaries: `--help` lists Summa's own flags (not Abseil's internals),
// and a bad flag or stray argument ends the program with a message and exit code 2.
#ifndef SUMMA_COMMON_FLAGS_H_
#define SUMMA_COMMON_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/atomic_file.h"  // WriteFileAtomically, for the port files flags name

namespace summa {

void ParseFlagsOrDie(int argc, char** argv, const char* usage);


// Blocks SIGINT and SIGTERM in this and every thread started later; call before starting threads.
void BlockTerminationSignals();
// Waits up to `timeout` for SIGINT or SIGTERM (blocked beforehand) and returns its number, or 0
// when none came.
int WaitForTerminationSignal(absl::Duration timeout);

}  // namespace summa

#endif  // SUMMA_COMMON_FLAGS_H_
