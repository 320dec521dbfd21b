// DataPath: serves the data path's methods (Initialize, Push, Pull, PushPull, AllReduce) on gRPC's async
// API. Its threads poll one completion queue; the thread that reads a call from the socket runs
// its handler (ParameterServerService::Serve*) and, when the answer is ready then, starts the
// reply, so a call that needs no other worker's contribution is served without a thread hop.
// A parked call is answered from whichever thread completes its step or round.
//
// Life cycle (server/daemon.cc): constructed right after the gRPC server started with the queue;
// Stop() after the server's Shutdown returned, which answered or failed every call.
#ifndef SUMMA_SERVER_RPC_DATA_PATH_H_
#define SUMMA_SERVER_RPC_DATA_PATH_H_

#include <grpcpp/grpcpp.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/rpc/service.h"

namespace summa::server {

class DataPath {
 public:
  // Calls asked of gRPC ahead, per method: an arriving call finds one waiting.
  static constexpr int kRequestsAhead = 4;

  // `service` and `queue` (from the builder that registered the service) are not owned and
  // outlive the DataPath. Starts `threads` threads on the queue.
  DataPath(ParameterServerService* service, grpc::ServerCompletionQueue* queue, int threads);
  DataPath(const DataPath&) = delete;
  DataPath& operator=(const DataPath&) = delete;
  ~DataPath() { Stop(); }

  // Shuts the queue down and joins the threads once every operation on it came back. Call after
  // the server's Shutdown() returned. Idempotent.
  void Stop();

  // Starts an operation on the queue unless it was shut down: `start` runs under a reader lock
  // that Stop() takes as a writer. False when the queue is shut down (nothing was started).
  template <typename Start>
  bool StartOp(Start start) {
    absl::ReaderMutexLock lock(&mu_);
    if (stopped_) return false;
    start();
    return true;
  }

 private:
  void Poll();

  ParameterServerService* const service_;
  grpc::ServerCompletionQueue* const queue_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_DATA_PATH_H_
