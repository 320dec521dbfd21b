// summa.v1.Worker: each worker's own status, served on its status port.
#ifndef SUMMA_WORKER_WORKER_SERVICE_H_
#define SUMMA_WORKER_WORKER_SERVICE_H_

#include "summa/v1/summa.grpc.pb.h"
#include "worker/status_board.h"

namespace summa::worker {

class WorkerService final : public summa::v1::Worker::CallbackService {
 public:
  explicit WorkerService(const StatusBoard* board) : board_(board) {}  // Not owned.

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const summa::v1::GetStatusRequest* request,
                                      summa::v1::WorkerStatus* response) override;

 private:
  const StatusBoard* const board_;
};

}  // namespace summa::worker

#endif  // SUMMA_WORKER_WORKER_SERVICE_H_
