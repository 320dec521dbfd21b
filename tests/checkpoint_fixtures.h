// What the checkpoint tests share (checkpoint_test.cc, checkpoint_codec_test.cc): a whole
// checkpoint in memory, encoded and decoded with the codec's pieces (server/core/checkpoint_codec.h).
#ifndef SUMMA_TESTS_CHECKPOINT_FIXTURES_H_
#define SUMMA_TESTS_CHECKPOINT_FIXTURES_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/core/checkpoint_codec.h"

namespace summa::server {

// A whole checkpoint in memory, made of the codec's pieces as the server's writer and reader use
// them (its header, then each partition), so that the codec's tests round-trip it without files.
struct ServerSnapshot {
  JobDescription job;
  std::vector<TensorSpec> specs;
  std::vector<PartitionSnapshot> partitions;
  absl::Time created = absl::InfinitePast();
  // The lowest partition version.
  uint64_t version() const {
    uint64_t low = partitions.empty() ? 0 : UINT64_MAX;
    for (const PartitionSnapshot& p : partitions) low = std::min(low, p.version);
    return low;
  }
};

inline summa::v1::Checkpoint EncodeCheckpoint(const ServerSnapshot& s) {
  summa::v1::Checkpoint c = EncodeCheckpointHeader(s.job, s.specs, s.version(), s.created);
  for (const PartitionSnapshot& p : s.partitions) *c.add_partitions() = EncodePartition(p);
  return c;
}

// The partitions of a whole Checkpoint message.
class MessagePartitions : public PartitionSource {
 public:
  explicit MessagePartitions(const summa::v1::Checkpoint& c) : c_(c) {}
  absl::StatusOr<bool> Next(summa::v1::PartitionCheckpoint* out) override {
    if (next_ == c_.partitions_size()) return false;
    *out = c_.partitions(next_++);
    return true;
  }

 private:
  const summa::v1::Checkpoint& c_;
  int next_ = 0;
};

inline absl::StatusOr<ServerSnapshot> DecodeCheckpoint(const summa::v1::Checkpoint& c, const JobDescription& ours) {
  SUMMA_ASSIGN_OR_RETURN(CheckpointHeader h, DecodeCheckpointHeader(c, ours));
  ServerSnapshot s;
  MessagePartitions source(c);
  SUMMA_RETURN_IF_ERROR(DecodePartitions(h, source, [&](PartitionSnapshot p) {
    s.partitions.push_back(std::move(p));
    return absl::OkStatus();
  }));
  s.job = std::move(h.job);
  s.specs = h.map.specs();
  s.created = h.created;
  return s;
}

}  // namespace summa::server

#endif  // SUMMA_TESTS_CHECKPOINT_FIXTURES_H_
