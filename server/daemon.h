// SummaServer: the daemon's life cycle around the core and its gRPC edge. It restores the newest
// checkpoint, starts the gRPC server (and Prometheus metrics, and a health-only port), and runs
// one thread of its own (the ticker) that expires leases and deadlines, writes due checkpoints,
// refreshes metrics and runs the edge's blocking tasks (the Checkpoint and Export RPCs' disk
// writes), so no gRPC thread blocks on disk. Another thread of its own waits for SIGINT/SIGTERM
// when asked. Both threads are joined by Shutdown(), which is idempotent and also run by the
// destructor. With --init_from it starts the model from a safetensors file (unless a checkpoint
// is restored); with --export it writes the final weights as safetensors on Shutdown. Thread-safe.
#ifndef SUMMA_SERVER_DAEMON_H_
#define SUMMA_SERVER_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/metrics.h"
#include "common/rpc/server_builder.h"
#include "common/rpc/transport.h"
#include "server/core/all_reduce.h"
#include "server/rpc/coordination.h"
#include "server/rpc/data_path.h"
#include "server/core/parameter_server.h"
#include "server/rpc/service.h"
#include "server/rpc/socket_plane.h"

namespace summa::server {

// A shard other than 0 follows shard 0 (server/rpc/coordination.h): its address, and what to call
// it with.
struct Coordinator {
  std::string address;  // empty: this server follows no one
  ClientSecurity security;
};

class SummaServer {
 public:
  // Restores the newest whole checkpoint in options.checkpoint_dir (if any: this shard's own, or
  // its partitions from every shard's of one version when the job ran with another shard count,
  // then written at once as its own; server/checkpoint/checkpoint_dir.h's RestoreNewestForShard),
  // then listens on
  // `address` ("127.0.0.1:0" picks a free port). With a `metrics_address`, also serves
  // Prometheus metrics there. `security`: TLS and the tokens calls need (common/rpc/transport.h).
  // With a `health_address`, also serves grpc.health.v1.Health alone there, in plaintext, with
  // the main port's serving status: for probes that cannot speak TLS (kubelet's grpc probes).
  // With a `data_address`, also serves the data path there on the socket data plane
  // (server/rpc/socket_plane.h), which clients find through the DataPlane call: plaintext only
  // (INVALID_ARGUMENT with TLS). With a `shm_socket` (a path), also serves the shared-memory
  // plane there, for workers on this host (the same class, server/rpc/socket_plane.h).
  static absl::StatusOr<std::unique_ptr<SummaServer>> Start(const std::string& address,
                                                            ServerOptions options,
                                                            const std::string& metrics_address = "",
                                                            EndpointSecurity security = {},
                                                            const std::string& health_address = "",
                                                            Coordinator coordinator = {},
                                                            const std::string& data_address = "",
                                                            const std::string& shm_socket = "");
  ~SummaServer();

  int port() const { return running_.port; }
  // The metrics port, or 0 without metrics.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // The health-only port, or 0 without one.
  int health_port() const { return health_.port; }
  // The socket data plane's port, or 0 without one.
  int data_port() const { return socket_plane_ ? socket_plane_->port() : 0; }
  ParameterServer& core() { return core_; }

  // Makes SIGINT and SIGTERM end Wait(). The signals must have been blocked in every thread
  // (BlockTerminationSignals before any thread starts).
  void StopOnTerminationSignals();
  // Blocks until Shutdown(), a termination signal, or the end of the job (a lost member that
  // did not rejoin in time); returns why the job ended, or "" otherwise.
  std::string Wait();
  // Reports NOT_SERVING (on the health port too), writes a last checkpoint (when a directory is
  // set), answers every waiting call with UNAVAILABLE, then stops the gRPC servers. Returns when
  // that is done, for every caller. A blocking task the edge hands over after the ticker stopped
  // runs on the caller's thread.
  void Shutdown();
  // Whether Shutdown wrote --export's file: OK without --export; the failure otherwise (no model
  // defined, or the file could not be written).
  absl::Status final_export() {
    absl::MutexLock lock(&shutdown_mu_);
    return final_export_;
  }

 private:
  SummaServer(ServerOptions options, TokenCheck tokens);
  void TickLoop();
  // Queues `task` for the ticker thread.
  void RunInBackground(std::function<void()> task);
  void UpdateMetrics();

  struct Metrics {
    prometheus::Counter* steps;
    prometheus::Counter* pushes;
    prometheus::Counter* pulls;
    prometheus::Counter* duplicates;
    prometheus::Counter* nonfinite;
    prometheus::Counter* bytes_in;
    prometheus::Counter* bytes_out;
    prometheus::Counter* allreduce_rounds;
    prometheus::Gauge* version;
    prometheus::Gauge* members_alive;
    prometheus::Gauge* checkpoint_age;
    prometheus::Gauge* learning_rate;
    prometheus::Histogram* step_seconds;
    // Backup workers (--backup_workers): in total, and per member by the label rank.
    prometheus::Counter* late_pushes;
    prometheus::Family<prometheus::Counter>* member_late_pushes;
    prometheus::Family<prometheus::Gauge>* member_push_delay;
    prometheus::Family<prometheus::Gauge>* member_last_push_delay;
    prometheus::Family<prometheus::Gauge>* member_steps_behind;
    // Embedding tables: all of them, then each by name.
    prometheus::Gauge* table_bytes;
    prometheus::Family<prometheus::Gauge>* table_rows;
    prometheus::Family<prometheus::Gauge>* table_rows_waiting;
    prometheus::Family<prometheus::Counter>* table_rows_created;
    prometheus::Family<prometheus::Counter>* table_rows_expired;
    prometheus::Family<prometheus::Counter>* table_rows_pulled;
    prometheus::Family<prometheus::Counter>* table_rows_pushed;
    prometheus::Family<prometheus::Counter>* table_dropped_gradients;
    // The socket data plane (--data_address): connections, and how their hellos went.
    prometheus::Gauge* plane_connections;
    prometheus::Counter* plane_hellos;
    prometheus::Counter* plane_hellos_failed;
    prometheus::Counter* plane_hello_evictions;
    // The shared-memory plane (--shm_socket): connections, and calls whose bytes went through
    // segments (requests read from the workers', replies written into the connections').
    prometheus::Gauge* shm_connections;
    prometheus::Counter* shm_requests;
    prometheus::Counter* shm_values;
    prometheus::Counter* shm_replies;
  };
  std::unique_ptr<MetricsEndpoint> metrics_;  // null without metrics
  Metrics m_{};

  ParameterServer core_;
  AllReduceHub hub_;
  TokenCheck tokens_;  // its files read again by the ticker (Refresh)
  ParameterServerService service_;
  RunningServer running_;
  std::unique_ptr<DataPath> data_path_;  // on running_.queues[0]; stopped after running_.server
  std::unique_ptr<SocketPlane> socket_plane_;  // null without --data_address
  std::unique_ptr<SocketPlane> shm_plane_;     // null without --shm_socket
  RunningServer health_;  // the health-only listener: follows running_.health; empty without one
  std::unique_ptr<ShardFollower> follower_;  // a shard other than 0 with a coordinator
  absl::Mutex shutdown_mu_;  // held through a whole Shutdown, so later callers wait for it
  bool shutdown_done_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Status final_export_ ABSL_GUARDED_BY(shutdown_mu_);
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool signalled_ ABSL_GUARDED_BY(mu_) = false;
  bool ticker_done_ ABSL_GUARDED_BY(mu_) = false;  // later tasks run on their caller's thread
  std::string job_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;   // leases, deadlines, checkpoints, metrics, background tasks
  std::thread signals_;  // waits for SIGINT/SIGTERM; only after StopOnTerminationSignals
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_DAEMON_H_
