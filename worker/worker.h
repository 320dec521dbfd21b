// RunWorker: everything summa-worker does after parsing its flags. Loads the data, picks the
// device, serves summa.v1.Worker on the status address, and trains.
#ifndef SUMMA_WORKER_WORKER_H_
#define SUMMA_WORKER_WORKER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/idx.h"
#include "common/rpc/transport.h"
#include "client/ps_client.h"
#include "worker/trainer.h"
#if SUMMA_FAULT_INJECTION
#include "worker/fault_injecting_store.h"
#endif

namespace summa::worker {

struct WorkerOptions {
  TrainerOptions trainer;
  std::string server = "127.0.0.1:50051";
  std::string device = "auto";  // one device, or a comma list to split the shard across
  int threads = 1;
  std::string data_dir = kDefaultDataDir;
  int64_t train_limit = 0;  // use only the first N training examples (0: all)
  int64_t test_limit = 0;   // evaluate only the first N test examples (0: all)
  std::string status_address = "0.0.0.0:0";
  std::string status_port_file;
  std::string metrics_address;  // Prometheus /metrics; empty: none
  std::string metrics_port_file;
  absl::Duration call_deadline = absl::Minutes(11);
  absl::Duration join_deadline = absl::Minutes(2);
  int channels = 1;  // TCP connections to the server; partition i travels on channel i % channels
  DataPlane data_plane = DataPlane::kAuto;
  std::string trace_file;  // when set: a Chrome trace of every step's stages, written at the end
  // After training: exit (a Job's pod), or wait until SIGTERM or SIGINT (a StatefulSet's or a
  // Deployment's, which would start an exited pod again; summa-worker --after_training=wait).
  bool after_training_wait = false;
  std::string example_log;  // when set: appended to, a line per attempt at a step (TrainerOptions)
  // TLS toward the server (its CA; this worker's certificate and key for mTLS, also served on
  // the status endpoint) and the token file, read at start and again when it changes.
  TlsFiles tls;
  std::string token_file;
#if SUMMA_FAULT_INJECTION
  // Fault injection for the process tests (FaultInjectingStore); nothing by default. Only in a
  // build with -DSUMMA_FAULT_INJECTION=ON (the test suite's).
  FaultPlan faults;
#endif
};

absl::Status RunWorker(const WorkerOptions& options);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_WORKER_H_
