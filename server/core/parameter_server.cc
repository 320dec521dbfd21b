#include "server/core/parameter_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/compression.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/vector_ops.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"

namespace summa::server {
namespace {

PolicyContext MakeContext(const ServerOptions& o, const Optimizer* optimizer, const Membership* members) {
  PolicyContext c;
  c.optimizer = optimizer;
  c.members = members;
  c.staleness = o.staleness;
  c.backup_workers = o.backup_workers;
  c.sync_every = o.sync_every;
  c.step_observer = o.step_observer;
  c.tracer = o.tracer;
  return c;
}

}  // namespace

ParameterServer::ParameterServer(ServerOptions options)
    : options_(std::move(options)),
      checkpoint_dir_(ShardCheckpointDir(options_.checkpoint_dir, options_.shard, options_.shards)),
      optimizer_(*Optimizer::Create(options_.optimizer)),
      membership_(options_.world_size, options_.on_worker_loss, options_.lease,
                  options_.rejoin_deadline, options_.clock, options_.require_sessions, options_.min_workers),
      policy_(ConsistencyPolicy::Create(options_.mode, MakeContext(options_, optimizer_.get(), &membership_))),
      started_(options_.clock->Now()),
      table_memory_(options_.limits.max_table_bytes) {
  if (options_.follower) membership_.set_follower(true);
  membership_.AddObserver([this] { OnMembershipChange(); });
  LogGroupsFrom(0);
}

void ParameterServer::LogGroupsFrom(uint64_t step) {
  // Read under the log's lock: of two changes logged at once, the later reads the later
  // membership.
  absl::MutexLock lock(&info_mu_);
  // The groups from `step` on as the membership has them now (admissions still to come too).
  std::vector<GroupChange> from_step;
  for (uint64_t next = step; next != UINT64_MAX;) {
    uint64_t until;
    GroupView group = membership_.GroupAt(next, &until);
    from_step.push_back({next, std::move(group)});
    next = until;
  }
  while (!group_log_.empty() && group_log_.back().from_step >= step) group_log_.pop_back();
  for (GroupChange& change : from_step) {
    // No step runs under an empty group (every member left at the job's end): nothing to log.
    if (change.group.ranks.empty()) continue;
    if (!group_log_.empty() && group_log_.back().group.ranks == change.group.ranks) continue;
    group_log_.push_back(std::move(change));
  }
  constexpr size_t kKept = 64;
  if (group_log_.size() > kKept) group_log_.erase(group_log_.begin(), group_log_.end() - kKept);
}

std::vector<GroupChange> ParameterServer::GroupLog() const {
  absl::MutexLock lock(&info_mu_);
  return group_log_;
}

ParameterServer::~ParameterServer() { Shutdown(); }

absl::Status ParameterServer::Gone(const Partition& p) const {
  if (p.retired) {
    return absl::NotFoundError("the server rolled back to an older version to agree with the other shards; Join again");
  }
  return Answerable();
}

absl::Status ParameterServer::Answerable() const {
  if (membership_.job_ended()) return absl::AbortedError(absl::StrCat("the job has ended: ", job_error()));
  if (shut_down_) return absl::UnavailableError("the server is shutting down");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParameterServer::Model>> ParameterServer::NewModel(
    std::vector<TensorSpec> specs, const std::vector<float>& flat,
    const std::vector<summa::v1::EmbeddingTableSpec>& tables) const {
  if (!tables.empty() && (options_.backup_workers > 0 || options_.sync_every > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "embedding tables are not served with ", options_.sync_every > 0 ? "DiLoCo (--mode=diloco)" : "--backup_workers",
        ": a table's step sums every member's rows (docs/embeddings.md)"));
  }
  TableContext table_context;
  table_context.mode = options_.mode;
  table_context.shard = options_.shard;
  table_context.shards = options_.shards;
  table_context.members = &membership_;
  table_context.memory = const_cast<TableMemory*>(&table_memory_);
  std::vector<std::unique_ptr<EmbeddingTable>> made;
  for (const summa::v1::EmbeddingTableSpec& spec : tables) {
    for (const auto& t : made) {
      if (t->name() == spec.name()) {
        return absl::InvalidArgumentError(absl::StrCat("embedding table '", spec.name(), "' is declared twice"));
      }
    }
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table, EmbeddingTable::Create(spec, table_context));
    made.push_back(std::move(table));
  }
  SUMMA_ASSIGN_OR_RETURN(PartitionMap map, PartitionMap::Create(std::move(specs), options_.partition_bytes));
  if (!flat.empty() && static_cast<int64_t>(flat.size()) != map.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", map.num_elements(),
                                                   " parameters but ", flat.size(), " values came"));
  }
  const int shards = options_.shards;
  if (static_cast<int>(map.partitions().size()) < shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model is ", map.partitions().size(), " partition", map.partitions().size() == 1 ? "" : "s", " of at most ",
        options_.partition_bytes, " bytes; ", shards, " shards need at least ", shards,
        " (give every shard a smaller --partition_bytes)"));
  }
  const std::vector<int> shard_of = AssignShards(map.partitions(), shards);
  auto model = std::make_unique<Model>(std::move(map));
  const int slots = static_cast<int>(optimizer_->SlotNames().size());
  const absl::Time now = options_.clock->Now();
  model->index_of.assign(model->map.partitions().size(), -1);
  for (const PartitionRange& range : model->map.partitions()) {
    if (shard_of[range.id] != options_.shard) continue;
    model->index_of[range.id] = static_cast<int>(model->partitions.size());
    model->partitions.push_back(std::make_unique<Partition>(
        range, options_.world_size,
        flat.empty() ? absl::Span<const float>() : absl::MakeConstSpan(flat.data() + range.offset, range.length),
        slots, now, options_.deterministic));
  }
  model->partitions.front()->reports = true;  // there is one: shards <= partitions
  for (const auto& p : model->partitions) {
    absl::MutexLock lock(&p->mu);  // unpublished: for the analysis
    p->step_group = membership_.GroupAt(0, &p->step_group_until);
    p->step_group_epoch = membership_.group_epoch();
  }
  if (flat.empty()) model->pending = static_cast<int>(model->partitions.size());
  model->tables = std::move(made);
  return model;
}

void ParameterServer::PublishModel(std::unique_ptr<Model> model) {
  model_owner_ = std::move(model);
  model_.store(model_owner_.get(), std::memory_order_release);
}

absl::Status ParameterServer::StartFrom(InitialWeights weights) {
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  int64_t total = 0;
  for (const TensorSpec& spec : weights.specs) total += spec.num_elements();
  if (total != static_cast<int64_t>(weights.flat.size())) {
    return absl::InvalidArgumentError(absl::StrCat(weights.source, ": its tensors hold ", total, " values, not ",
                                                   weights.flat.size()));
  }
  initial_ = std::move(weights);
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckInitialModel(const InitialWeights& initial, const JoinRequestView& request) const {
  const std::vector<TensorSpec>& file = initial.specs;
  auto in = [](const std::vector<TensorSpec>& specs, const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  };
  std::vector<TensorSpec> model;
  for (const JoinTensor& t : request.params) model.push_back(t.spec);
  std::string why;
  for (size_t i = 0; i < std::max(file.size(), model.size()) && why.empty(); ++i) {
    if (i >= model.size()) {
      why = absl::StrCat(file[i].name, ": in ", initial.source, ", not in the model");
    } else if (i >= file.size() || !in(file, model[i].name)) {
      why = absl::StrCat(model[i].name, ": in the model, not in ", initial.source);
    } else if (!in(model, file[i].name)) {
      why = absl::StrCat(file[i].name, ": in ", initial.source, ", not in the model");
    } else if (model[i].name != file[i].name) {
      why = absl::StrCat("tensor ", i, " is ", model[i].name, " in the model and ", file[i].name, " in ",
                         initial.source, ": the order differs");
    } else if (model[i].shape != file[i].shape) {
      why = absl::StrCat(model[i].name, ": shape ", ShapeString(file[i].shape), " in ", initial.source, ", ",
                         ShapeString(model[i].shape), " in the model");
    }
  }
  if (why.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("the model does not match --init_from: ", why));
}

absl::Status ParameterServer::DefineModel(const JoinRequestView& request) {
  if (initial_.has_value()) SUMMA_RETURN_IF_ERROR(CheckInitialModel(*initial_, request));
  std::vector<TensorSpec> specs;
  int64_t total = 0;
  for (const JoinTensor& t : request.params) {
    specs.push_back(t.spec);
    const bool whole = static_cast<int64_t>(t.data.size()) == t.spec.num_bytes();
    // Values the file replaces may be left out.
    if (request.values_follow ? !t.data.empty() : !whole && !(initial_.has_value() && t.data.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.spec.name, "' of shape ", ShapeString(t.spec.shape), " needs ",
          t.spec.num_bytes(), " bytes of float32 values, got ", t.data.size()));
    }
    total += t.spec.num_elements();
  }
  std::vector<float> flat;
  std::string values_from = request.values_follow ? "; the initial values follow partition by partition" : "";
  if (initial_.has_value()) {
    // The file's values, whatever the joiner sent: its tensors are the file's (checked above).
    flat = std::move(initial_->flat);
    values_from = absl::StrCat("; the initial values are ", initial_->source, "'s (--init_from)");
  } else if (!request.values_follow) {
    flat.resize(total);
    int64_t offset = 0;
    for (const JoinTensor& t : request.params) {
      std::memcpy(flat.data() + offset, t.data.data(), t.data.size());
      offset += t.spec.num_elements();
    }
  }
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> defined, NewModel(std::move(specs), flat, request.tables));
  initial_.reset();
  PublishModel(std::move(defined));
  SUMMA_LOG(INFO) << "model defined by rank " << request.rank << ": " << request.params.size()
                  << " tensors, " << model()->map.num_elements() << " parameters in "
                  << model()->partitions.size() << " partitions" << values_from
                  << (request.tables.empty() ? "" : absl::StrCat("; ", request.tables.size(), " embedding table(s)"));
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckSameModel(const Model& model, const JoinRequestView& request) const {
  // A joiner that uses no table declares none; one that declares them declares the job's.
  if (!request.tables.empty()) {
    if (request.tables.size() != model.tables.size()) {
      return absl::FailedPreconditionError(absl::StrCat("model mismatch: the job has ", model.tables.size(),
                                                        " embedding table(s), this worker declares ",
                                                        request.tables.size()));
    }
    for (size_t i = 0; i < model.tables.size(); ++i) {
      absl::StatusOr<summa::v1::EmbeddingTableSpec> theirs = EmbeddingTable::Normalized(request.tables[i]);
      if (!theirs.ok()) return theirs.status();
      if (theirs->SerializeAsString() != model.tables[i]->spec().SerializeAsString()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model mismatch at embedding table ", i, ": the job's is {", model.tables[i]->spec().ShortDebugString(),
            "}, this worker declares {", theirs->ShortDebugString(), "}"));
      }
    }
  }
  const std::vector<TensorSpec>& ours = model.map.specs();
  for (size_t i = 0; i < std::max(ours.size(), request.params.size()); ++i) {
    if (i >= request.params.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model mismatch: the server's model has tensor '", ours[i].name, "' ",
          ShapeString(ours[i].shape), " (", ours.size(), " tensors), this worker's has ",
          request.params.size(), " tensors"));
    }
    const TensorSpec& theirs = request.params[i].spec;
    if (i >= ours.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model mismatch: unknown parameter '", theirs.name, "'; the server's model has ",
          ours.size(), " tensors"));
    }
    if (!(theirs == ours[i])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model mismatch at tensor ", i, ": server has '", ours[i].name, "' ",
          ShapeString(ours[i].shape), ", this worker sent '", theirs.name, "' ",
          ShapeString(theirs.shape)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JoinResult> ParameterServer::Join(const JoinRequestView& request) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  if (options_.sync_every > 0 && !request.takes_local_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this is a DiLoCo job (summa-server --mode=", JobModeName(options_), ", ", options_.sync_every,
        " local steps between exchanges) and the joiner does not take local steps: its pushes would be "
        "gradients, taken as pseudo-gradients. Join with summa-worker (of this release or later) or the "
        "Python summa.DiLoCo"));
  }
  if (request.world_size != options_.world_size &&
      (!membership_.elastic() || request.world_size < options_.min_workers || request.world_size > options_.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this worker expects ", request.world_size, " workers but the server was started for ",
        membership_.elastic() ? absl::StrCat(options_.min_workers, " to ", options_.world_size) : absl::StrCat(options_.world_size)));
  }
  if (request.rank < -1 || request.rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank, " is outside the group of ",
                                                   options_.world_size, " (ranks 0..",
                                                   options_.world_size - 1, "; -1 to be assigned one)"));
  }
  for (const JoinTensor& t : request.params) {
    absl::Status shape = ValidateShape(t.spec.shape);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.spec.name, "': ", shape.message()));
    }
  }
  int64_t model_bytes = 0;
  for (const JoinTensor& t : request.params) {
    model_bytes += t.spec.num_bytes();  // each shape is bounded, and so is the count of tensors
    if (model_bytes > options_.limits.max_model_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model declared holds more than ", options_.limits.max_model_bytes,
          " bytes (summa-server --max_model_bytes)"));
    }
  }
  // Held to the end: a rollback (which replaces the model and voids sessions under it) comes
  // wholly before this join or wholly after it.
  absl::MutexLock lock(&define_mu_);
  if (model_owner_ == nullptr) {
    const bool has_values = !request.params.empty() &&
                            std::all_of(request.params.begin(), request.params.end(),
                                        [](const JoinTensor& t) { return !t.data.empty(); });
    // With --init_from the values are the file's: a joiner that describes the model defines it.
    const bool from_file = initial_.has_value() && !request.params.empty();
    if (!has_values && !request.values_follow && !from_file) {
      return absl::UnavailableError(absl::StrCat(
          "no model yet: rank ", request.rank, " must wait until a worker (rank 0) joins with the "
          "initial values; retry"));
    }
    SUMMA_RETURN_IF_ERROR(DefineModel(request));
  }
  const Model& m = *model();
  SUMMA_RETURN_IF_ERROR(CheckSameModel(m, request));
  const int pending = m.pending.load(std::memory_order_acquire);
  if (pending > 0 && !request.values_follow) {
    return absl::UnavailableError(absl::StrCat("the model's initial values are still arriving (",
                                               m.partitions.size() - pending, " of ", m.partitions.size(),
                                               " partitions have them); retry"));
  }
  SUMMA_ASSIGN_OR_RETURN(const Admitted admitted, Admit(m, request));
  const int rank = admitted.rank;
  JoinResult result;
  result.rank = rank;
  result.session = admitted.session;
  for (const auto& p : m.partitions) result.partitions.push_back(p->range);
  result.version = UINT64_MAX;
  result.next_step = UINT64_MAX;
  for (const auto& p : m.partitions) {
    absl::ReaderMutexLock plock(&p->mu);
    result.version = std::min(result.version, p->version);
    result.next_step = std::min(result.next_step, policy_->NextStep(*p, rank));
  }
  if (options_.mode == Mode::kSync && admitted.from_step > result.next_step) {
    // Admitted from a step the job has not reached: it pulls that step's weights (its pull waits
    // for them) and pushes from there.
    result.version = result.next_step = admitted.from_step;
  }
  // One value: the ranks a worker shards its data over and the view its pushes are stamped with.
  const GroupView group = membership_.GroupAt(result.next_step);
  result.live_ranks = group.ranks;
  result.view = group.view;
  result.initialize = pending > 0;
  if (options_.shards > 1 && options_.mode == Mode::kSync && !options_.checkpoint_dir.empty()) {
    result.checkpoint_versions = CheckpointVersions(checkpoint_dir_);
  }
  result.restored = restored_.load(std::memory_order_acquire);
  SUMMA_LOG(INFO) << "rank " << rank << " joined from " << request.peer << " at version "
                  << result.version << " (" << JobModeName(options_) << " mode)";
  return result;
}

absl::StatusOr<Admitted> ParameterServer::Admit(const Model& m, const JoinRequestView& request)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // every partition's lock, taken and released in id order
  if (!membership_.elastic()) return membership_.Admit(request.rank, request.peer, request.status_address);
  // A joiner of a running sync job takes part from the first step no worker can have started
  // under the old group: workers learn a step's group from the replies of the step before, so
  // the step after the newest any partition is at. With every partition's lock held no step
  // completes meanwhile, and (one shard) partitions differ by at most one step. A step with no
  // member left runs under no one: the joiner takes it. Async and ssp have no common step: the
  // joiner is in at once, at the slowest member's step. Every join of an elastic job takes the
  // locks, so that whether it grows is decided with the step, under the membership's own lock.
  for (const auto& p : m.partitions) p->mu.Lock();
  uint64_t newest = 0, oldest = UINT64_MAX;
  for (const auto& p : m.partitions) {
    newest = std::max(newest, p->version);
    oldest = std::min(oldest, p->version);
  }
  const bool empty = membership_.GroupAt(oldest).ranks.empty();
  const uint64_t from = options_.mode != Mode::kSync ? 0 : empty ? oldest : newest + 1;
  absl::StatusOr<Admitted> admitted = membership_.Admit(request.rank, request.peer, request.status_address, from);
  if (admitted.ok() && admitted->grew) {
    for (const auto& p : m.partitions) policy_->OnAdmitted(*p, admitted->rank, admitted->from_step);
    for (const auto& t : m.tables) t->OnAdmitted(admitted->rank, admitted->from_step);
  }
  for (auto it = m.partitions.rbegin(); it != m.partitions.rend(); ++it) (*it)->mu.Unlock();
  if (admitted.ok() && admitted->grew) LogGroupsFrom(admitted->from_step);
  return admitted;
}

absl::Status ParameterServer::Heartbeat(int rank, uint64_t session) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  return membership_.Touch(rank, session);
}

absl::Status ParameterServer::Leave(int rank, uint64_t session) { return membership_.Leave(rank, session); }

void ParameterServer::OnMembershipChange() {
  const Model* m = model();
  if (m == nullptr) return;
  if (membership_.job_ended()) {
    FailParked(absl::AbortedError(absl::StrCat("the job has ended: ", job_error())));
    return;
  }
  const absl::Time now = options_.clock->Now();
  uint64_t step = UINT64_MAX;
  uint64_t restarted = UINT64_MAX;  // the step some partition started again, if any
  for (const auto& p : m->partitions) {
    CallsToFinish released;
    {
      absl::MutexLock lock(&p->mu);
      if (p->retired) continue;  // a rollback replaced the model since it was read
      const uint64_t before = p->version;
      const uint64_t restarts = p->restarts;
      policy_->OnExcluded(*p, now, released);
      if (p->restarts != restarts) restarted = p->version;
      if (p->version != before) {
        MaybeFreeze(*m, *p);
        restored_.store(false, std::memory_order_release);
      }
      step = std::min(step, p->version);
    }
    CountAnswers(released, p->range.length);
  }
  for (const auto& t : m->tables) {
    CallsToFinish released;
    t->OnMembershipChange(released);
  }
  if (step != UINT64_MAX) LogGroupsFrom(options_.mode == Mode::kSync ? step : 0);
  if (restarted != UINT64_MAX) {
    const GroupView group = membership_.GroupAt(restarted);
    SUMMA_LOG(INFO) << "step " << restarted << " starts again over ranks " << absl::StrJoin(group.ranks, ", ")
                    << ": a member of its group left during it";
  }
}

void ParameterServer::FailParked(const absl::Status& status) {
  const Model* m = model();
  if (m == nullptr) return;
  CallsToFinish failed;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    if (p->retired) continue;  // its calls were failed as it was retired
    p->parked.FailAll(status, failed);
    p->clock_parked.FailAll(status, failed);
  }
  for (const auto& t : m->tables) t->FailParked(status, failed);
}

void ParameterServer::Tick(absl::Time now) {
  membership_.Tick(now);
  const Model* m = model();
  if (m == nullptr) return;
  CallsToFinish expired;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    if (p->retired) continue;
    auto why = [&] {
      return absl::DeadlineExceededError(absl::StrCat("barrier deadline of ",
                                                      absl::FormatDuration(BarrierDeadline()),
                                                      " passed: ", policy_->WaitingFor(*p)));
    };
    p->parked.Expire(now, why, expired);
    p->clock_parked.Expire(now, why, expired);
  }
  for (const auto& t : m->tables) t->Expire(now, expired);
}

void ParameterServer::Shutdown() {
  shut_down_ = true;
  FailParked(absl::UnavailableError("the server is shutting down"));
}

StatusSnapshot ParameterServer::Traffic() const {
  StatusSnapshot s;
  s.bytes_in = bytes_in_.load();
  s.bytes_out = bytes_out_.load();
  s.pushes_served = pushes_served_.load();
  s.pulls_served = pulls_served_.load();
  return s;
}

uint64_t ParameterServer::version() const {
  const Model* m = model();
  if (m == nullptr || m->partitions.empty()) return 0;
  uint64_t version = UINT64_MAX;
  for (const auto& p : m->partitions) {
    absl::ReaderMutexLock lock(&p->mu);
    version = std::min(version, p->version);
  }
  return version;
}

StatusSnapshot ParameterServer::Status() const {
  StatusSnapshot s;
  s.optimizer = optimizer_->Describe();
  s.uptime = options_.clock->Now() - started_;
  s.members = membership_.Snapshot();
  s.view = membership_.view();
  s.group_log = GroupLog();
  {
    absl::MutexLock info(&info_mu_);
    s.checkpoint = checkpoint_;
    s.rollbacks = rollbacks_;
    s.last_rollback_version = last_rollback_version_;
  }
  s.job_error = job_error();
  if (const Model* m = model(); m != nullptr) {
    s.model_defined = true;
    s.partitions_pending = m->pending.load();
    s.params = m->map.specs();
    s.parameter_count = m->map.num_elements();
    s.partition_count = static_cast<int>(m->partitions.size());
    s.version = UINT64_MAX;
    if (options_.backup_workers > 0) s.lateness.resize(options_.world_size);
    for (const auto& p : m->partitions) {
      s.partition_bytes_held += p->range.length * 4;
      absl::ReaderMutexLock lock(&p->mu);
      s.version = std::min(s.version, p->version);
      for (size_t r = 0; r < s.lateness.size(); ++r) {
        const RankLateness& from = p->lateness[r];
        RankLateness& to = s.lateness[r];
        to.late_pushes += from.late_pushes;
        to.timed_pushes += from.timed_pushes;
        to.total_delay += from.total_delay;
        to.last_delay = std::max(to.last_delay, from.last_delay);
        to.steps_behind = std::max(to.steps_behind, from.steps_behind);
        s.late_pushes += from.late_pushes;
      }
      if (p->reports) {
        s.steps_restarted = p->restarts;
        s.examples_applied = p->examples_applied;
        s.last_step = p->last_step;
        s.learning_rate = optimizer_->LearningRate(p->version);
      }
    }
    for (const auto& t : m->tables) s.tables.push_back(t->Counters());
  } else {
    s.learning_rate = optimizer_->LearningRate(0);
  }
  s.table_bytes = table_memory_.used();
  s.max_table_bytes = table_memory_.limit();
  const StatusSnapshot traffic = Traffic();
  s.bytes_in = traffic.bytes_in;
  s.bytes_out = traffic.bytes_out;
  s.pushes_served = traffic.pushes_served;
  s.pulls_served = traffic.pulls_served;
  s.duplicate_pushes = duplicate_pushes_.load();
  s.nonfinite_pushes = nonfinite_pushes_.load();
  s.stale_view_pushes = stale_view_pushes_.load();
  return s;
}

}  // namespace summa::server
