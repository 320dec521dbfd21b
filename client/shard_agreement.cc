#include "client/shard_agreement.h"

#include <algorithm>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace summa::worker {

bool NeedsAgreement(const std::vector<ShardVersions>& shards) {
  uint64_t low = UINT64_MAX, high = 0;
  for (const ShardVersions& s : shards) {
    low = std::min(low, s.version);
    high = std::max(high, s.version);
  }
  if (high - low > 1) return true;
  if (high == low) return false;
  for (const ShardVersions& s : shards) {
    if (s.version == low && s.restored) return true;
  }
  return false;
}

absl::StatusOr<Agreement> PlanAgreement(const std::vector<ShardVersions>& shards) {
  if (shards.empty()) return absl::InvalidArgumentError("no shards");
  uint64_t low = UINT64_MAX;
  for (const ShardVersions& s : shards) low = std::min(low, s.version);
  // Candidates, newest first: the lowest shard's version and any checkpoint below it.
  std::vector<uint64_t> candidates = {low};
  for (const ShardVersions& s : shards) {
    for (uint64_t v : s.checkpoints) {
      if (v <= low) candidates.push_back(v);
    }
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  for (uint64_t v : candidates) {
    bool feasible = true;
    for (const ShardVersions& s : shards) {
      feasible &= s.version == v || std::binary_search(s.checkpoints.begin(), s.checkpoints.end(), v);
    }
    if (!feasible) continue;
    // Every shard is asked, those at `v` too: one whose lowest partition is at `v` may hold
    // others a step on, and the step is redone from `v` everywhere (a shard wholly at `v`
    // changes nothing).
    Agreement plan{v, {}};
    for (size_t i = 0; i < shards.size(); ++i) plan.roll_back.push_back(static_cast<int>(i));
    return plan;
  }
  std::string kept;
  for (size_t i = 0; i < shards.size(); ++i) {
    absl::StrAppend(&kept, i == 0 ? "" : "; ", "shard ", i, " at version ", shards[i].version, " keeps ",
                    shards[i].checkpoints.empty() ? "no checkpoints" : absl::StrCat("checkpoints of versions ",
                                                                                      absl::StrJoin(shards[i].checkpoints, ", ")));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no version is common to every shard (", kept, "); start the shards with a larger --keep_checkpoints, or "
      "restart every shard from checkpoints of one version"));
}

}  // namespace summa::worker
