#include "common/health_service.h"

#include <algorithm>

namespace summa {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

bool HealthService::Known(const std::string& service) const {
  return service.empty() || std::find(services_.begin(), services_.end(), service) != services_.end();
}

HealthCheckResponse::ServingStatus HealthService::Current() const {
  const bool serving = serving_ && (leader_ == nullptr || leader_->Current() == HealthCheckResponse::SERVING);
  return serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Known(request->service())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service '" + request->service() + "'"));
    return reactor;
  }
  response->set_status(Current());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {
// Sends the current status once and keeps the stream open until the client goes away or the
// server shuts down (which cancels it), as the health protocol's Watch expects.
class WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit WatchReactor(HealthCheckResponse::ServingStatus status) {
    response_.set_status(status);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) FinishOnce();
  }
  void OnCancel() override { FinishOnce(); }
  void OnDone() override { delete this; }

 private:
  void FinishOnce() {
    if (!finished_.exchange(true)) Finish(grpc::Status::CANCELLED);
  }

  HealthCheckResponse response_;
  std::atomic<bool> finished_{false};
};
}  // namespace

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  HealthCheckResponse::ServingStatus status =
      Known(request->service()) ? Current() : HealthCheckResponse::SERVICE_UNKNOWN;
  return new WatchReactor(status);
}

}  // namespace summa
