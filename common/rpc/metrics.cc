#include "common/rpc/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace summa {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address) {
  std::unique_ptr<MetricsEndpoint> m(new MetricsEndpoint());
  m->registry_ = std::make_shared<prometheus::Registry>();
  try {
    // civetweb reports a failed bind by throwing; it stops here, at our border.
    m->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  m->exposer_->RegisterCollectable(m->registry_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics on ", address, " bound no port"));
  m->port_ = ports[0];
  return m;
}

MetricsEndpoint::~MetricsEndpoint() = default;

prometheus::Counter& MetricsEndpoint::Counter(const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
}

prometheus::Gauge& MetricsEndpoint::Gauge(const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
}

prometheus::Family<prometheus::Counter>& MetricsEndpoint::CounterFamily(const std::string& name,
                                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
}

prometheus::Family<prometheus::Gauge>& MetricsEndpoint::GaugeFamily(const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
}

prometheus::Histogram& MetricsEndpoint::StepHistogram(const std::string& name, const std::string& help) {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 0.001; b < 40; b *= 2) buckets.push_back(b);
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add({}, buckets);
}

void AdvanceCounter(prometheus::Counter& counter, double total) {
  const double now = counter.Value();
  if (total > now) counter.Increment(total - now);
}

}  // namespace summa
