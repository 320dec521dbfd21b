// The checkpoint reader: the fuzz input as a whole file (magic, length, CRC), and, so that the
// fuzzer gets past the CRC, the input's message written by the real writer; each read back by
// the streaming reader and restored into ParameterServer against one of a few jobs.
//
// Input: one control byte (bit 0: the rest is a message to frame, not a file; the other bits,
// modulo 3: the job, fuzz/checkpoint_jobs.h), then the rest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/logging.h"
#include "fuzz/checkpoint_jobs.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/parameter_server.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_peer.h"

namespace summa::server {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "checkpoint_fuzzer: %s\n", what);
    std::abort();
  }
}

// Where every input's checkpoint is written: one directory for the fuzzer's whole run, under
// $TMPDIR, removed when it exits (a crash leaves it beside the crashing input).
std::string& WorkDir() {
  static std::string dir;
  return dir;
}

}  // namespace
}  // namespace summa::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace summa::server;
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  // As idx_fuzzer makes its own (temp_directory_path reads $TMPDIR).
  std::string pattern = (std::filesystem::temp_directory_path() / "checkpoint_fuzzer.XXXXXX").string();
  Check(::mkdtemp(pattern.data()) != nullptr, "cannot make a directory for the checkpoints");
  WorkDir() = pattern;
  std::atexit([] { std::filesystem::remove_all(WorkDir()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace summa::server;
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string& dir = WorkDir();
  std::string path;
  if (control & 1) {
    // A message written the way the writer writes it, so that the fuzzer gets past the CRC.
    summa::v1::Checkpoint message;
    if (!message.ParseFromString(rest)) return 0;  // protobuf's
    summa::v1::Checkpoint header = message;
    header.clear_partitions();
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer = CheckpointWriter::Create(dir, header);
    if (!writer.ok()) return 0;
    for (const summa::v1::PartitionCheckpoint& p : message.partitions()) {
      if (!(*writer)->Append(p).ok()) return 0;
    }
    absl::StatusOr<std::string> written = (*writer)->Finish(/*keep=*/1);
    Check(written.ok(), "a checkpoint cannot be written");
    path = *written;
  } else {
    path = dir + "/ckpt-input.summa";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << rest;
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
  if (!reader.ok()) return 0;
  ParameterServer server(CheckpointFuzzJob(control >> 1));
  absl::Status restored = server.Restore((*reader)->header(), **reader);
  if (!restored.ok()) return 0;
  // What was restored is served: every partition answers a pull of its version at once.
  const StatusSnapshot status = server.Status();
  Check(status.model_defined && status.partitions_pending == 0, "a restored model is not ready");
  Check(static_cast<int64_t>(ParameterServerPeer::Weights(server).size()) == status.parameter_count,
        "the restored weights are not the model's size");
  int64_t pulled = 0;
  for (int p = 0; p < status.partition_count; ++p) {
    auto call = std::make_shared<FakeCall>();
    server.Pull(/*rank=*/-1, /*session=*/0, p, /*min_version=*/0, call);
    Check(call->answered() && call->Wait().ok(), "a restored partition does not answer a pull");
    pulled += call->values().size();
  }
  Check(pulled == status.parameter_count, "the pulls do not add up to the model");
  return 0;
}
