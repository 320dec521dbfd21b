// The gRPC edge of the daemon: summa.v1.ParameterServer over the callback API, translating
// messages to the core's views and statuses back to gRPC. Waiting calls are parked reactors, not
// blocked threads; work that blocks (a checkpoint's disk writes) is handed to the daemon's own
// thread and the call finished from there. The daemon's life cycle is server/daemon.h.
#ifndef SUMMA_SERVER_SERVICE_H_
#define SUMMA_SERVER_SERVICE_H_

#include <functional>

#include "common/transport.h"
#include "server/all_reduce.h"
#include "server/coordination.h"
#include "server/limits.h"
#include "server/parameter_server.h"
#include "server/parked_call.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {

// The data path (Initialize, Push, Pull, PushPull, AllReduce) is served raw: values are read from gRPC's
// receive slices straight into the core's buffers, and replies send the core's immutable
// snapshots as slices, without protobuf's copies (common/wire.h). The wire is unchanged.
using ServiceBase = summa::v1::ParameterServer::WithRawCallbackMethod_Initialize<
    summa::v1::ParameterServer::WithRawCallbackMethod_Push<
    summa::v1::ParameterServer::WithRawCallbackMethod_Pull<
        summa::v1::ParameterServer::WithRawCallbackMethod_PushPull<
            summa::v1::ParameterServer::WithRawCallbackMethod_AllReduce<
                summa::v1::ParameterServer::CallbackService>>>>>;

class ParameterServerService final : public ServiceBase {
 public:
  // Runs a task off the gRPC threads, later.
  using Background = std::function<void(std::function<void()>)>;
  // Neither is owned; both outlive the service.
  // `tokens` (not owned; outlives the service) says which calls need which token.
  ParameterServerService(ParameterServer* core, AllReduceHub* hub, Background background,
                         const TokenCheck* tokens)
      : core_(core),
        hub_(hub),
        background_(std::move(background)),
        tokens_(tokens),
        parked_("parked calls", core->options().limits.max_parked_calls, "max_parked_calls",
                core->options().limits.max_parked_calls_per_peer, "max_parked_calls_per_peer"),
        in_flight_("bytes in flight", INT64_MAX, "", core->options().limits.max_bytes_in_flight_per_peer,
                   "max_bytes_in_flight_per_peer"),
        joins_(core->options().limits.join_rate, core->options().world_size, core->options().clock) {}

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
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RollBack(grpc::CallbackServerContext* context,
                                     const summa::v1::RollBackRequest* request,
                                     summa::v1::RollBackResponse* response) override;
  grpc::ServerUnaryReactor* Initialize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AllReduce(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const summa::v1::GetStatusRequest* request,
                                      summa::v1::ServerStatus* response) override;
  grpc::ServerUnaryReactor* Follow(grpc::CallbackServerContext* context,
                                   const summa::v1::ShardReport* request,
                                   summa::v1::ShardView* response) override;

  // Shard 0 of several: answers the Follow calls held at a view the membership has left (an
  // exclusion, the job's end). The daemon registers it as a membership observer.
  void OnMembershipChange();
  // Answers every held Follow call and holds none from now on (the daemon's shutdown, first of
  // all: followers are then answered at once while the server winds down).
  void StopHoldingReports();

 private:
  ParameterServer* const core_;  // Not owned.
  AllReduceHub* const hub_;      // Not owned.
  const Background background_;
  const TokenCheck* const tokens_;  // Not owned.
  // What callers' calls hold (server/limits.h): a parked call holds one of `parked_` until it is
  // answered and forgotten; a request's values hold their bytes of `in_flight_` while applied or,
  // for an AllReduce, until the round completes.
  PeerBudget parked_;
  PeerBudget in_flight_;
  JoinRate joins_;
  ShardBoard shards_;  // shard 0 of several: the other shards' reports
  // Shard 0 of several: Follow calls held until the view moves past their target (the
  // report's view + 1) or their wait ends (each call's own gRPC alarm).
  absl::Mutex held_mu_;
  ParkingLot held_reports_ ABSL_GUARDED_BY(held_mu_);
  bool holding_ ABSL_GUARDED_BY(held_mu_) = true;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_SERVICE_H_
