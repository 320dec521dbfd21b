// The checkpoint side of ParameterServer: what the job is, a consistent snapshot of every
// partition written through server/checkpoint.h a partition at a time, and the restore that
// refuses another job's and fills the model a partition at a time.
#include <algorithm>

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
  j.shard = options_.shard;
  j.shards = options_.shards;
  j.optimizer_name = optimizer_->name();
  j.optimizer = optimizer_->Describe();
  j.slot_names = optimizer_->SlotNames();
  return j;
}

absl::Status ParameterServer::Restore(const summa::v1::Checkpoint& header, PartitionSource& partitions) {
  SUMMA_ASSIGN_OR_RETURN(const CheckpointHeader h, DecodeCheckpointHeader(header, Job()));
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  // Built unpublished, so a checkpoint found torn halfway leaves no model behind.
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, NewModel(h.map.specs(), {}));
  uint64_t low = UINT64_MAX;
  SUMMA_RETURN_IF_ERROR(DecodePartitions(h, partitions, [&](PartitionSnapshot snap) {
    Partition& p = *model->partitions[model->index_of[snap.id]];  // one of h.held: this shard's
    absl::MutexLock plock(&p.mu);
    // Copied into the partition's own buffers: the optimizer holds views of the slots.
    std::copy(snap.weights.begin(), snap.weights.end(), p.weights.begin());
    for (size_t i = 0; i < snap.slots.size(); ++i) std::copy(snap.slots[i].begin(), snap.slots[i].end(), p.slots[i].begin());
    p.initialized = true;
    p.version = snap.version;
    p.updates = snap.updates;
    p.next_step = std::move(snap.next_steps);
    low = std::min(low, snap.version);
    return absl::OkStatus();
  }));
  model->pending = 0;
  PublishModel(std::move(model));
  absl::MutexLock info(&info_mu_);
  checkpoint_.version = low;
  checkpoint_.written = h.created;
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
  const bool one_version = policy_->CheckpointNeedsOneVersion();
  // Sync: every partition at one moment, so all their locks (in id order) are held while they
  // are copied. Async and ssp: each partition records its own version and pushes, so each is
  // copied under its own lock alone, as it is written.
  std::vector<PartitionSnapshot> copies;
  for (const auto& p : m->partitions) p->mu.Lock();
  uint64_t low = UINT64_MAX, high = 0;
  for (const auto& p : m->partitions) {
    low = std::min(low, p->version);
    high = std::max(high, p->version);
  }
  const bool due = force || (options_.checkpoint_every > 0 &&
                             low >= last + static_cast<uint64_t>(options_.checkpoint_every));
  const bool consistent = !one_version || low == high;
  const bool write = due && consistent && (low != last || force);
  if (write && one_version) {
    copies.reserve(m->partitions.size());
    for (const auto& p : m->partitions) {
      copies.push_back({p->range.id, p->version, p->updates, p->weights, p->slots, p->next_step});
      // Sync: pushes to the step in progress are summed, not applied, and the checkpoint does
      // not hold that sum; after a restore their ranks push that step again.
      for (uint64_t& next : copies.back().next_steps) next = std::min(next, p->version);
    }
  }
  for (auto it = m->partitions.rbegin(); it != m->partitions.rend(); ++it) (*it)->mu.Unlock();
  if (!due) return absl::OkStatus();
  if (!consistent) return absl::FailedPreconditionError("partitions are between versions; retry");
  if (!write) return absl::OkStatus();  // nothing new since the last one
  const absl::Time created = options_.clock->Now();
  // `low`: in async and ssp mode, partitions may move past it before they are copied.
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                         CheckpointWriter::Create(options_.checkpoint_dir,
                                                  EncodeCheckpointHeader(Job(), m->map.specs(), low, created)));
  for (size_t i = 0; i < m->partitions.size(); ++i) {
    PartitionSnapshot snap;
    if (one_version) {
      snap = std::move(copies[i]);  // freed once written
    } else {
      const Partition& p = *m->partitions[i];
      absl::MutexLock plock(&p.mu);
      snap = {p.range.id, p.version, p.updates, p.weights, p.slots, p.next_step};
    }
    SUMMA_RETURN_IF_ERROR(writer->Append(EncodePartition(snap)));
  }
  SUMMA_ASSIGN_OR_RETURN(const std::string path, writer->Finish());
  absl::MutexLock info(&info_mu_);
  checkpoint_ = {path, low, created};
  SUMMA_LOG(INFO) << "checkpoint at version " << low << " written to " << path;
  return absl::OkStatus();
}

}  // namespace summa::server
