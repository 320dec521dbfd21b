#include "common/rpc/health_service.h"

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

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (!Known(request->service())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + request->service() + "'");
  }
  response->set_status(Current());
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  if (watches_.fetch_add(1) >= kMaxWatches) {
    watches_.fetch_sub(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "too many health watches at once: use Check, or watch from fewer clients");
  }
  const bool known = Known(request->service());
  HealthCheckResponse response;
  response.set_status(HealthCheckResponse::UNKNOWN);
  while (!context->IsCancelled()) {
    const HealthCheckResponse::ServingStatus now = known ? Current() : HealthCheckResponse::SERVICE_UNKNOWN;
    if (now != response.status()) {
      response.set_status(now);
      if (!writer->Write(response)) break;  // the client went away
    }
    absl::SleepFor(kWatchInterval);
  }
  watches_.fetch_sub(1);
  return grpc::Status::CANCELLED;
}

}  // namespace summa
