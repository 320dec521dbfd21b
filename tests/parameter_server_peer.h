// What tests (and the checkpoint fuzzer) read of a ParameterServer beyond its API: the whole flat
// weights (of one server, or of a job's shards together), to compare with what they expect. A
// friend of ParameterServer, so that the production class carries no method for tests.
#ifndef SUMMA_TESTS_PARAMETER_SERVER_PEER_H_
#define SUMMA_TESTS_PARAMETER_SERVER_PEER_H_

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/core/parameter_server.h"

namespace summa::server {

class ParameterServerPeer {
 public:
  // A copy of this server's partitions' weights, end to end in id order (the model's whole flat
  // buffer without shards); empty before the model exists. Thread-safe (each partition's lock).
  static std::vector<float> Weights(const ParameterServer& server) {
    const ParameterServer::Model* m = server.model();
    if (m == nullptr) return {};
    std::vector<float> flat;
    flat.reserve(m->map.num_elements());
    for (const auto& p : m->partitions) {
      absl::ReaderMutexLock lock(&p->mu);
      flat.insert(flat.end(), p->weights.begin(), p->weights.end());
    }
    return flat;
  }

  // The whole flat weights of a job on `shards`, each partition from the shard that holds it; NaN
  // where none does. Empty before the first shard's model exists. Thread-safe.
  static std::vector<float> JobWeights(const std::vector<const ParameterServer*>& shards) {
    std::vector<float> flat;
    for (const ParameterServer* server : shards) {
      const ParameterServer::Model* m = server->model();
      if (m == nullptr) continue;
      if (flat.empty()) flat.assign(m->map.num_elements(), std::numeric_limits<float>::quiet_NaN());
      for (const auto& p : m->partitions) {
        absl::ReaderMutexLock lock(&p->mu);
        std::copy(p->weights.begin(), p->weights.end(), flat.begin() + p->range.offset);
      }
    }
    return flat;
  }
};

}  // namespace summa::server

#endif  // SUMMA_TESTS_PARAMETER_SERVER_PEER_H_
