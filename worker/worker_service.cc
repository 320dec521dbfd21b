#include "worker/worker_service.h"

namespace summa::worker {

grpc::ServerUnaryReactor* WorkerService::GetStatus(grpc::CallbackServerContext* context,
                                                   const summa::v1::GetStatusRequest* request,
                                                   summa::v1::WorkerStatus* response) {
  const WorkerState s = board_->Get();
  response->set_rank(s.rank);
  response->set_world_size(s.world_size);
  response->set_device(s.device);
  response->set_model(s.model);
  response->set_server(s.server);
  response->set_epoch(s.epoch);
  response->set_epochs(s.epochs);
  response->set_step(s.step);
  response->set_examples_per_second(s.examples_per_second);
  response->set_last_loss(s.last_loss);
  response->set_last_test_accuracy(s.last_test_accuracy);
  response->set_uptime_seconds(absl::ToDoubleSeconds(board_->uptime()));
  response->set_state(s.state);
  response->set_mode(s.mode);
  response->set_joins(s.joins);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace summa::worker
