// What tests (and the checkpoint fuzzer) read of a ParameterServer beyond its API: the whole flat
// weights, to compare with what they expect. A friend of ParameterServer, so that the production
// class carries no method for tests.
#ifndef SUMMA_TESTS_PARAMETER_SERVER_PEER_H_
#define SUMMA_TESTS_PARAMETER_SERVER_PEER_H_

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
};

}  // namespace summa::server

#endif  // SUMMA_TESTS_PARAMETER_SERVER_PEER_H_
