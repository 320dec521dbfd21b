// A sync job's shards at a worker's Join: whether they stand at versions that must be brought
// together first (one restored from an older checkpoint), and to which version. Used by
// ParameterClient::Join (client/ps_client_join.cc). Free functions; thread-safe.
#ifndef SUMMA_CLIENT_SHARD_AGREEMENT_H_
#define SUMMA_CLIENT_SHARD_AGREEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace summa::worker {

// Where one shard of a sync-mode job stands at a worker's Join: its version, and the versions of
// the checkpoints it keeps.
struct ShardVersions {
  uint64_t version = 0;
  std::vector<uint64_t> checkpoints;
  bool restored = false;  // its state is a checkpoint's, and no step has completed since
};

// Whether the shards must be brought to one version before this worker resumes: they are more
// than one step apart, or one step apart with the one behind restored from a checkpoint (more
// than one step apart otherwise is a push-pull that reached some shards and not others, which
// the shard that has it takes again as a duplicate).
bool NeedsAgreement(const std::vector<ShardVersions>& shards);

// How the shards come to agree when they are more than one step apart (one was restored from an
// older checkpoint): every shard in `roll_back` (each of them) goes back to `version`, restoring
// its checkpoint of it unless it is wholly there already, so that the step is redone on the
// weights of one version everywhere.
struct Agreement {
  uint64_t version = 0;
  std::vector<int> roll_back;  // shard indices
};

// The newest version the shards can agree on: at most the lowest shard's, and for every shard
// its own version or a checkpoint it keeps. FAILED_PRECONDITION naming each shard's version and
// checkpoints when there is none.
absl::StatusOr<Agreement> PlanAgreement(const std::vector<ShardVersions>& shards);

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_SHARD_AGREEMENT_H_
