// The gRPC edge of the daemon: summa.v1.ParameterServer over the callback API, translating
// messages to the core's views and statuses back to gRPC. Waiting calls are parked reactors, not
// blocked threads. SummaServer bundles the core, the service, the gRPC server and the thread that
// expires parked calls at their deadlines.
#ifndef SUMMA_SERVER_SERVICE_H_
#define SUMMA_SERVER_SERVICE_H_

#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/server_builder.h"
#include "server/all_reduce.h"
#include "server/parameter_server.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {

class ParameterServerService final : public summa::v1::ParameterServer::CallbackService {
 public:
  // Neither is owned; both outlive the service.
  ParameterServerService(ParameterServer* core, AllReduceHub* hub) : core_(core), hub_(hub) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const summa::v1::JoinRequest* request,
                                 summa::v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const summa::v1::HeartbeatRequest* request,
                                      summa::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const summa::v1::LeaveRequest* request,
                                  summa::v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const summa::v1::CheckpointRequest* request,
                                       summa::v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const summa::v1::PushRequest* request,
                                 summa::v1::PushResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const summa::v1::PullRequest* request,
                                 summa::v1::PullResponse* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const summa::v1::PushRequest* request,
                                     summa::v1::PullResponse* response) override;
  grpc::ServerUnaryReactor* AllReduce(grpc::CallbackServerContext* context,
                                      const summa::v1::AllReduceRequest* request,
                                      summa::v1::AllReduceResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const summa::v1::GetStatusRequest* request,
                                      summa::v1::ServerStatus* response) override;

 private:
  ParameterServer* const core_;  // Not owned.
  AllReduceHub* const hub_;      // Not owned.
};

// A running daemon. Thread-safe; Shutdown() is idempotent and also run by the destructor.
class SummaServer {
 public:
  // Restores the newest whole checkpoint in options.checkpoint_dir (if any), then listens on
  // `address` ("127.0.0.1:0" picks a free port).
  // With a `metrics_address`, also serves Prometheus metrics there.
  static absl::StatusOr<std::unique_ptr<SummaServer>> Start(const std::string& address,
                                                            ServerOptions options,
                                                            const std::string& metrics_address = "");
  ~SummaServer();

  int port() const { return running_.port; }
  // The metrics port, or 0 without metrics.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  ParameterServer& core() { return core_; }
  // Blocks until Shutdown() or until the job ends (a lost member that did not rejoin in time);
  // returns why the job ended, or "" after a plain shutdown.
  std::string Wait();
  // Writes a last checkpoint (when a directory is set), answers every waiting call with
  // UNAVAILABLE, then stops the gRPC server. Returns when that is done, for every caller.
  void Shutdown();

 private:
  explicit SummaServer(ServerOptions options);
  void TickLoop();
  void UpdateMetrics();

  struct Metrics {
    prometheus::Counter* steps;
    prometheus::Counter* pushes;
    prometheus::Counter* pulls;
    prometheus::Counter* duplicates;
    prometheus::Counter* bytes_in;
    prometheus::Counter* bytes_out;
    prometheus::Counter* allreduce_rounds;
    prometheus::Gauge* version;
    prometheus::Gauge* members_alive;
    prometheus::Gauge* checkpoint_age;
    prometheus::Histogram* step_seconds;
  };
  std::unique_ptr<MetricsEndpoint> metrics_;  // null without metrics
  Metrics m_{};

  ParameterServer core_;
  AllReduceHub hub_;
  ParameterServerService service_;
  RunningServer running_;
  absl::Mutex shutdown_mu_;  // held through a whole Shutdown, so later callers wait for it
  bool shutdown_done_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_error_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;  // leases, deadlines and checkpoints
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_SERVICE_H_
