// grpc.health.v1.Health, generated from Debian's grpc-proto so that server reflection can
// describe it (Debian's built-in health service is invisible to reflection). Answers SERVING for
// "" and for every service name it was given, NOT_FOUND for others, and NOT_SERVING after
// SetServing(false). A health service that follows a leader (another endpoint's, e.g. a
// plaintext port for probes beside a TLS one) answers for the leader's services and is serving
// only while the leader is too. Thread-safe.
#ifndef SUMMA_COMMON_HEALTH_SERVICE_H_
#define SUMMA_COMMON_HEALTH_SERVICE_H_

#include <atomic>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace summa {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  explicit HealthService(std::vector<std::string> services) : services_(std::move(services)) {}
  // `leader` is not owned and must outlive this service.
  explicit HealthService(const HealthService* leader) : services_(leader->services_), leader_(leader) {}

  void SetServing(bool serving) { serving_ = serving; }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  bool Known(const std::string& service) const;
  grpc::health::v1::HealthCheckResponse::ServingStatus Current() const;

  const std::vector<std::string> services_;
  const HealthService* const leader_ = nullptr;  // Not owned.
  std::atomic<bool> serving_{true};
};

}  // namespace summa

#endif  // SUMMA_COMMON_HEALTH_SERVICE_H_
