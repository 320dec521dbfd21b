// summa-server's flags, defined in flags.cc so that summa-server and the test of their defaults
// (tests/server_flags_test.cc) link the same definitions. A flag that fills an option takes its
// default from a default-constructed options struct, so the two cannot disagree; the functions
// below read the flags (after absl::ParseCommandLine) into the daemon's options.
#ifndef SUMMA_SERVER_FLAGS_H_
#define SUMMA_SERVER_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/rpc/transport.h"
#include "server/core/job_options.h"
#include "server/daemon.h"

// What summa-server's main reads itself: where to listen, and where to report it.
ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, metrics_address);
ABSL_DECLARE_FLAG(std::string, metrics_port_file);
ABSL_DECLARE_FLAG(std::string, health_address);
ABSL_DECLARE_FLAG(std::string, health_port_file);
ABSL_DECLARE_FLAG(std::string, data_address);
ABSL_DECLARE_FLAG(std::string, shm_socket);
ABSL_DECLARE_FLAG(std::string, data_port_file);
ABSL_DECLARE_FLAG(std::string, trace_file);

namespace summa::server {

// The job's flags as server options (validated), or INVALID_ARGUMENT for the first bad one.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();
// TLS and tokens; the token files are read. INVALID_ARGUMENT (or the file's error) when they
// cannot work together.
absl::StatusOr<EndpointSecurity> SecurityFromFlags();
// The token flags as they are (SecurityFromFlags reads and checks the files).
TokenFiles TokenFilesFromFlags();
// The shard this one follows (--coordinator) and what it calls it with.
absl::StatusOr<Coordinator> CoordinatorFromFlags();

}  // namespace summa::server

#endif  // SUMMA_SERVER_FLAGS_H_
