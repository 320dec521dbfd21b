// The checkpoint reader: ParseCheckpointBytes on the fuzz input as a whole file (magic, length,
// CRC), and, so that the fuzzer gets past the CRC, on the input's message framed the way the
// writer frames it; then DecodeCheckpoint and ParameterServer::Restore against one of a few jobs.
//
// Input: one control byte (bit 0: the rest is a message to frame, not a file; the other bits,
// modulo 3: the job, fuzz/checkpoint_jobs.h), then the rest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/logging.h"
#include "fuzz/checkpoint_jobs.h"
#include "server/checkpoint.h"
#include "server/parameter_server.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "checkpoint_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace
}  // namespace summa::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace summa::server;
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const absl::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<summa::v1::Checkpoint> checkpoint;
  if (control & 1) {
    summa::v1::Checkpoint message;
    if (!message.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) return 0;  // protobuf's
    absl::StatusOr<std::string> file = FrameCheckpoint(message);
    if (!file.ok()) return 0;
    checkpoint = ParseCheckpointBytes(*file, "fuzz");
    Check(checkpoint.ok(), "a checkpoint as the writer frames it does not read back");
    Check(checkpoint->SerializeAsString() == message.SerializeAsString(), "the checkpoint read back differs");
  } else {
    checkpoint = ParseCheckpointBytes(rest, "fuzz");
    if (!checkpoint.ok()) return 0;
  }
  ParameterServer server(CheckpointFuzzJob(control >> 1));
  absl::Status restored = server.Restore(*checkpoint);
  if (!restored.ok()) return 0;
  // What was restored is served: every partition answers a pull of its version at once.
  const StatusSnapshot status = server.Status();
  Check(status.model_defined && status.partitions_pending == 0, "a restored model is not ready");
  Check(static_cast<int64_t>(server.WeightsForTest().size()) == status.parameter_count,
        "the restored weights are not the model's size");
  int64_t pulled = 0;
  for (int p = 0; p < status.partition_count; ++p) {
    auto call = std::make_shared<FakeCall>();
    server.Pull(/*rank=*/-1, p, /*min_version=*/0, call);
    Check(call->answered() && call->Wait().ok(), "a restored partition does not answer a pull");
    pulled += call->values().size();
  }
  Check(pulled == status.parameter_count, "the pulls do not add up to the model");
  return 0;
}
