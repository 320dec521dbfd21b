// The checkpoint side of ParameterServer: what the job is, a consistent snapshot of every
// partition written through server/checkpoint.h, and the restore that refuses another job's.
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/checkpoint.h"
#include "server/parameter_server.h"  // the class whose methods these are

namespace summa::server {

JobDescription ParameterServer::Job() const {
  JobDescription j;
  j.world_size = options_.world_size;
  j.mode = options_.mode;
  j.partition_bytes = options_.partition_bytes;
  j.optimizer_name = optimizer_->name();
  j.optimizer = optimizer_->Describe();
  j.slot_names = optimizer_->SlotNames();
  return j;
}

absl::Status ParameterServer::Restore(const summa::v1::Checkpoint& c) {
  SUMMA_ASSIGN_OR_RETURN(ServerSnapshot s, DecodeCheckpoint(c, Job()));
  std::vector<float> flat;
  for (const PartitionSnapshot& p : s.partitions) flat.insert(flat.end(), p.weights.begin(), p.weights.end());
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  SUMMA_RETURN_IF_ERROR(BuildModel(s.specs, flat));
  for (const PartitionSnapshot& snap : s.partitions) {
    Partition& p = *model_owner_->partitions[snap.id];
    absl::MutexLock plock(&p.mu);
    p.version = snap.version;
    p.updates = snap.updates;
    for (size_t i = 0; i < snap.slots.size(); ++i) p.slots[i] = snap.slots[i];
    p.next_step = snap.next_steps;
  }
  absl::MutexLock info(&info_mu_);
  checkpoint_.version = s.version();
  checkpoint_.written = s.created;
  return absl::OkStatus();
}

absl::Status ParameterServer::MaybeCheckpoint(bool force) {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  const Model* m = model();
  if (m == nullptr || m->pending.load() > 0) return absl::OkStatus();  // nothing to keep yet
  uint64_t last;
  {
    absl::MutexLock info(&info_mu_);
    last = checkpoint_.version;
  }
  ServerSnapshot s;
  s.job = Job();
  s.specs = m->map.specs();
  // Every partition at one moment: hold all their locks (in id order) while copying.
  for (const auto& p : m->partitions) p->mu.Lock();
  uint64_t low = UINT64_MAX, high = 0;
  for (const auto& p : m->partitions) {
    low = std::min(low, p->version);
    high = std::max(high, p->version);
  }
  const bool due = force || (options_.checkpoint_every > 0 &&
                             low >= last + static_cast<uint64_t>(options_.checkpoint_every));
  const bool consistent = !policy_->CheckpointNeedsOneVersion() || low == high;
  if (due && consistent && (low != last || force)) {
    for (const auto& p : m->partitions) {
      s.partitions.push_back({p->range.id, p->version, p->updates, p->weights, p->slots, p->next_step});
      if (policy_->CheckpointNeedsOneVersion()) {
        // Sync: pushes to the step in progress are summed, not applied, and the checkpoint does
        // not hold that sum; after a restore their ranks push that step again.
        for (uint64_t& next : s.partitions.back().next_steps) next = std::min(next, p->version);
      }
    }
  }
  for (auto it = m->partitions.rbegin(); it != m->partitions.rend(); ++it) (*it)->mu.Unlock();
  if (!due) return absl::OkStatus();
  if (!consistent) return absl::FailedPreconditionError("partitions are between versions; retry");
  if (s.partitions.empty()) return absl::OkStatus();  // nothing new since the last one
  s.created = options_.clock->Now();
  const summa::v1::Checkpoint c = EncodeCheckpoint(s);
  SUMMA_ASSIGN_OR_RETURN(const std::string path, WriteCheckpoint(options_.checkpoint_dir, c));
  absl::MutexLock info(&info_mu_);
  checkpoint_ = {path, c.version(), s.created};
  SUMMA_LOG(INFO) << "checkpoint at version " << c.version() << " written to " << path;
  return absl::OkStatus();
}

}  // namespace summa::server
