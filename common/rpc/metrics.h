// MetricsEndpoint: a Prometheus scrape endpoint (/metrics over HTTP, Debian's prometheus-cpp)
// and the registry its metrics live in. Thread-safe (prometheus-cpp's metrics are).
#ifndef SUMMA_COMMON_RPC_METRICS_H_
#define SUMMA_COMMON_RPC_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace summa {

class MetricsEndpoint {
 public:
  // Serves /metrics on `address` ("host:port"; port 0 picks a free one). UNAVAILABLE when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address);
  ~MetricsEndpoint();

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  // One unlabelled metric of each kind, registered under `name`.
  prometheus::Counter& Counter(const std::string& name, const std::string& help);
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help);
  // A family of labelled metrics registered under `name`, whose members are added as their
  // labels appear (Family::Add, idempotent).
  prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name, const std::string& help);
  // Buckets for step times: 1 ms to about 33 s, doubling.
  prometheus::Histogram& StepHistogram(const std::string& name, const std::string& help);

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

// Brings a counter up to `total` (counters only go up; the sources keep running totals).
void AdvanceCounter(prometheus::Counter& counter, double total);

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_METRICS_H_
