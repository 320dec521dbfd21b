// The gRPC edge of the daemon: summa.v1.ParameterServer (the data path on gRPC's async API, the
// rest synchronous: below), translating messages to the core's views and statuses back to gRPC.
// A data-path call that waits (a pull for the next version, an AllReduce for the other ranks) is
// parked, not a blocked thread; work that blocks (a checkpoint's disk writes) is handed to the
// daemon's own thread. The daemon's life cycle is server/daemon.h.
#ifndef SUMMA_SERVER_RPC_SERVICE_H_
#define SUMMA_SERVER_RPC_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "common/rpc/data_method.h"
#include "common/rpc/transport.h"
#include "server/core/all_reduce.h"
#include "server/rpc/coordination.h"
#include "server/core/limits.h"
#include "server/core/parameter_server.h"
#include "server/core/parked_call.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {

// The data path (Initialize, Push, Pull, PushPull, AllReduce) is served raw: values are read from
// gRPC's receive slices straight into the core's buffers, and replies send the core's immutable
// snapshots as slices, without protobuf's copies (common/rpc/wire.h). The wire is unchanged. It is
// served on gRPC's async API by threads of the server's own (server/rpc/data_path.h), which read,
// handle and answer a call on one thread. The rest (the control plane) is synchronous. No method
// is a callback: with one, gRPC's own callback threads poll the sockets too and hand each call
// over to another thread (a 4 KiB two-rank AllReduce took 176-220 µs with the control plane as
// callbacks, 100-170 µs without; a hop costs tens of µs on this VM).
using ServiceBase = summa::v1::ParameterServer::WithRawMethod_Initialize<
    summa::v1::ParameterServer::WithRawMethod_Push<
    summa::v1::ParameterServer::WithRawMethod_Pull<
    summa::v1::ParameterServer::WithRawMethod_PushPull<
    summa::v1::ParameterServer::WithRawMethod_AllReduce<
    summa::v1::ParameterServer::WithRawMethod_SparsePull<
    summa::v1::ParameterServer::WithRawMethod_SparsePush<summa::v1::ParameterServer::Service>>>>>>>;

// Whoever sends a parked call's answer: an async data-path call, or a held report's thread.
class Answerable {
 public:
  virtual ~Answerable() = default;
  // Called exactly once; the call may be gone when it returns.
  virtual void Answer(const grpc::Status& status) = 0;
};

// A data-path call as its handler sees it (server/rpc/data_path.h serves it): its context and
// request, and the response that Answer sends. Answer may come from any thread, during the
// handler or after it returned; nothing of the call is touched after it.
class DataCall : public Answerable {
 public:
  // Who called (gRPC's peer string: "ipv4:127.0.0.1:5555"), and who its token says it is, if the
  // token admits `role` (TokenCheck::Identify).
  virtual std::string peer() const = 0;
  virtual absl::StatusOr<Caller> Identify(const TokenCheck& tokens, Role role) const = 0;
  virtual const grpc::ByteBuffer& request() const = 0;
  // The request as one piece of memory (starting on a 16-byte boundary) that the handler may
  // write over and that lives while it runs, where it came so (the socket data plane's): its
  // values are then read in place, not copied.
  virtual std::optional<absl::Span<char>> whole_request() { return std::nullopt; }
  // Whether whole_request() is memory its sender may still write while the handler reads it (the
  // shared-memory plane's segments): values are then checked and summed in one read, never two.
  virtual bool request_shared() const { return false; }
  // Where whole_request() is the message up to its values, which are its last bytes: those values
  // (the shared-memory plane's values segment, which its sender may write too). Unset: the message
  // is whole.
  virtual std::optional<absl::string_view> values_elsewhere() const { return std::nullopt; }
  virtual grpc::ByteBuffer* response() = 0;

  // The parked call that answers this one, set by the handler before the core sees it: a client
  // that goes away while it waits has it claimed and answered CANCELLED (OnCancelled, from the
  // data path), which lets go of what it holds at the next sweep instead of at its step's end.
  // A client gone before the handler parked the call (its end came while the handler parsed)
  // has it answered as it parks.
  void Parks(const std::shared_ptr<ParkedCall>& parked) {
    {
      absl::MutexLock lock(&parked_mu_);
      parked_ = parked;
      if (!cancelled_) return;
    }
    Cancel(*parked);
  }
  void OnCancelled() {
    std::shared_ptr<ParkedCall> parked;
    {
      absl::MutexLock lock(&parked_mu_);
      cancelled_ = true;
      parked = parked_.lock();
    }
    if (parked != nullptr) Cancel(*parked);
  }

  // A reply of values to a worker (its rank and session) from one partition, set by the Pull and PushPull
  // handlers on the thread that serves the call: the data planes write a worker's such replies
  // one at a time, the earliest partition first (server/rpc/reply_turns.h). Empty worker: none.
  void OrderReply(std::string worker, int64_t partition) {
    reply_worker_ = std::move(worker);
    reply_partition_ = partition;
  }
  const std::string& reply_worker() const { return reply_worker_; }
  int64_t reply_partition() const { return reply_partition_; }

 private:
  static void Cancel(ParkedCall& parked) {
    if (parked.Claim()) parked.Finish(absl::CancelledError("cancelled by the client"));
  }

  absl::Mutex parked_mu_;
  std::weak_ptr<ParkedCall> parked_ ABSL_GUARDED_BY(parked_mu_);
  bool cancelled_ ABSL_GUARDED_BY(parked_mu_) = false;
  std::string reply_worker_;
  int64_t reply_partition_ = -1;
};

// ParameterServer::Export, retried for up to two seconds while the partitions are between
// versions (a sync step completing: the workers' next pull or compute leaves a moment when every
// partition is at one). Blocks on disk I/O and sleeps: the daemon's thread, never gRPC's.
absl::StatusOr<ExportedModel> ExportWhenOneVersion(ParameterServer& core, const std::string& dir,
                                                   const std::string& file_name);

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

  // The control plane: synchronous, each call on a thread of gRPC's sync server.
  grpc::Status Join(grpc::ServerContext* context, const summa::v1::JoinRequest* request,
                    summa::v1::JoinResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const summa::v1::HeartbeatRequest* request,
                         summa::v1::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const summa::v1::LeaveRequest* request,
                     summa::v1::LeaveResponse* response) override;
  // Checkpoint and RollBack wait for the daemon's thread (Background) to do the disk work.
  grpc::Status Checkpoint(grpc::ServerContext* context, const summa::v1::CheckpointRequest* request,
                          summa::v1::CheckpointResponse* response) override;
  // Export too: it writes the weights' file on the daemon's thread.
  grpc::Status Export(grpc::ServerContext* context, const summa::v1::ExportRequest* request,
                      summa::v1::ExportResponse* response) override;
  grpc::Status RollBack(grpc::ServerContext* context, const summa::v1::RollBackRequest* request,
                        summa::v1::RollBackResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const summa::v1::GetStatusRequest* request,
                         summa::v1::ServerStatus* response) override;
  // Shard 0's long poll: a held report keeps its thread until the view moves or its wait ends;
  // at most kMaxHeldReports at once (more are answered at once, not held).
  static constexpr int kMaxHeldReports = 64;
  grpc::Status Follow(grpc::ServerContext* context, const summa::v1::ShardReport* request,
                      summa::v1::ShardView* response) override;
  grpc::Status DataPlane(grpc::ServerContext* context, const summa::v1::DataPlaneRequest* request,
                         summa::v1::DataPlaneResponse* response) override;
  // The socket data plane's port (server/rpc/socket_plane.h), which DataPlane tells; 0: none.
  void set_data_plane_port(int port, bool tls) {
    data_plane_tls_.store(tls, std::memory_order_relaxed);
    // Release: a DataPlane call that sees the port sees whether it speaks TLS.
    data_plane_port_.store(port, std::memory_order_release);
  }
  // The shared-memory plane's socket and instance, which DataPlane tells. Set once, before the
  // server serves.
  void set_shm_plane(std::string path, uint64_t instance) {
    shm_socket_ = std::move(path);
    shm_instance_ = instance;
  }

  // A data-path call (from gRPC's data path, server/rpc/data_path.h, or the socket plane), on the
  // thread that read it: authorized by server/rpc/method_roles.h's table (the token's role, then,
  // once its request is parsed, the rank it acts as), then served.
  void ServeData(DataMethod method, DataCall* call);
  // The bytes the data path's threads keep in their request buffers between calls (at most
  // 16 MiB a thread): memory the limits do not hold per peer, shown in GetStatus.
  static int64_t request_buffer_bytes();

  // Shard 0 of several: answers the Follow calls held at a view the membership has left (an
  // exclusion, the job's end). The daemon registers it as a membership observer.
  void OnMembershipChange();
  // Answers every held Follow call and holds none from now on (the daemon's shutdown, first of
  // all: followers are then answered at once while the server winds down).
  void StopHoldingReports();

 private:
  // OK when the call's token holds the role server/rpc/method_roles.h gives `method` and may act
  // as the request's `rank` (ActingRank; kAnyRank for a method whose request names none), with
  // the rank it acts as in `*acting` (when given); the refusal to answer with otherwise.
  grpc::Status Authorize(const grpc::ServerContextBase& context, std::string_view method, int rank = kAnyRank,
                         int* acting = nullptr) const;
  // Each refuses a request whose rank `caller` may not act as (ActingRank) before anything else.
  void ServeInitialize(DataCall* call, const Caller& caller);
  void ServePush(DataCall* call, const Caller& caller);
  void ServePull(DataCall* call, const Caller& caller);
  void ServePushPull(DataCall* call, const Caller& caller);
  void ServeAllReduce(DataCall* call, const Caller& caller);
  void ServeSparsePull(DataCall* call, const Caller& caller);
  void ServeSparsePush(DataCall* call, const Caller& caller);

  // Runs `task` on the daemon's thread (Background) and waits for it.
  void OnDaemonThread(absl::FunctionRef<void()> task);

  ParameterServer* const core_;  // Not owned.
  AllReduceHub* const hub_;      // Not owned.
  const Background background_;
  const TokenCheck* const tokens_;  // Not owned.
  // What callers' calls hold (server/core/limits.h): a parked call holds one of `parked_` until it is
  // answered (a client that goes away has its call answered then); a request's values hold their
  // bytes of `in_flight_` while applied or, for an AllReduce, until the round completes.
  PeerBudget parked_;
  PeerBudget in_flight_;
  JoinRate joins_;
  ShardBoard shards_;  // shard 0 of several: the other shards' reports
  std::atomic<int> data_plane_port_{0};
  std::atomic<bool> data_plane_tls_{false};
  std::string shm_socket_;
  uint64_t shm_instance_ = 0;
  // Shard 0 of several: Follow calls held until the view moves past their target (the
  // report's view + 1) or their wait ends (each waits on its handler's thread). Each holds a
  // thread of gRPC's: at most kMaxHeldReports at once, the others answered at once.
  absl::Mutex held_mu_;
  ParkingLot held_reports_ ABSL_GUARDED_BY(held_mu_);
  bool holding_ ABSL_GUARDED_BY(held_mu_) = true;
  int held_ ABSL_GUARDED_BY(held_mu_) = 0;  // reports waiting on their thread
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_SERVICE_H_
