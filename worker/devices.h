// Chooses the worker's backend from a --device value: "cpu", "cuda:N", or "auto" (a GPU when
// one works, else the CPU, saying so once).
#ifndef SUMMA_WORKER_DEVICES_H_
#define SUMMA_WORKER_DEVICES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend.h"

namespace summa::worker {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, int cpu_threads);

}  // namespace summa::worker

#endif  // SUMMA_WORKER_DEVICES_H_
