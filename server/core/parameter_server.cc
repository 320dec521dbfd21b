#include "server/core/parameter_server.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/compression.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/vector_ops.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"

namespace summa::server {
namespace {

absl::Span<const float> AsFloats(absl::string_view bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

PolicyContext MakeContext(const ServerOptions& o, const Optimizer* optimizer, const Membership* members) {
  PolicyContext c;
  c.optimizer = optimizer;
  c.members = members;
  c.staleness = o.staleness;
  c.step_observer = o.step_observer;
  c.tracer = o.tracer;
  return c;
}

}  // namespace

ParameterServer::ParameterServer(ServerOptions options)
    : options_(std::move(options)),
      optimizer_(*Optimizer::Create(options_.optimizer)),
      membership_(options_.world_size, options_.on_worker_loss, options_.lease,
                  options_.rejoin_deadline, options_.clock, options_.require_sessions),
      policy_(ConsistencyPolicy::Create(options_.mode, MakeContext(options_, optimizer_.get(), &membership_))),
      started_(options_.clock->Now()) {
  if (options_.follower) membership_.set_follower(true);
  membership_.AddObserver([this] { OnMembershipChange(); });
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
    std::vector<TensorSpec> specs, const std::vector<float>& flat) const {
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
  if (flat.empty()) model->pending = static_cast<int>(model->partitions.size());
  return model;
}

void ParameterServer::PublishModel(std::unique_ptr<Model> model) {
  model_owner_ = std::move(model);
  model_.store(model_owner_.get(), std::memory_order_release);
}

absl::Status ParameterServer::DefineModel(const JoinRequestView& request) {
  std::vector<TensorSpec> specs;
  int64_t total = 0;
  for (const JoinTensor& t : request.params) {
    specs.push_back(t.spec);
    if (request.values_follow ? !t.data.empty() : static_cast<int64_t>(t.data.size()) != t.spec.num_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.spec.name, "' of shape ", ShapeString(t.spec.shape), " needs ",
          t.spec.num_bytes(), " bytes of float32 values, got ", t.data.size()));
    }
    total += t.spec.num_elements();
  }
  std::vector<float> flat(request.values_follow ? 0 : total);
  int64_t offset = 0;
  for (const JoinTensor& t : request.params) {
    if (!request.values_follow) std::memcpy(flat.data() + offset, t.data.data(), t.data.size());
    offset += t.spec.num_elements();
  }
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> defined, NewModel(std::move(specs), flat));
  PublishModel(std::move(defined));
  SUMMA_LOG(INFO) << "model defined by rank " << request.rank << ": " << request.params.size()
                  << " tensors, " << model()->map.num_elements() << " parameters in "
                  << model()->partitions.size() << " partitions"
                  << (request.values_follow ? "; the initial values follow partition by partition" : "");
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckSameModel(const Model& model, const JoinRequestView& request) const {
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
  if (request.world_size != options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("this worker expects ", request.world_size,
                                                   " workers but the server was started for ",
                                                   options_.world_size));
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
    if (!has_values && !request.values_follow) {
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
  SUMMA_ASSIGN_OR_RETURN(const Admitted admitted,
                         membership_.Admit(request.rank, request.peer, request.status_address));
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
  result.live_ranks = LiveRanks();
  result.view = membership_.view();
  result.initialize = pending > 0;
  if (options_.shards > 1 && options_.mode == Mode::kSync && !options_.checkpoint_dir.empty()) {
    result.checkpoint_versions = CheckpointVersions(options_.checkpoint_dir);
  }
  result.restored = restored_.load(std::memory_order_acquire);
  SUMMA_LOG(INFO) << "rank " << rank << " joined from " << request.peer << " at version "
                  << result.version << " (" << ModeName(options_.mode) << " mode)";
  return result;
}

absl::Status ParameterServer::Heartbeat(int rank, uint64_t session) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  return membership_.Touch(rank, session);
}

absl::Status ParameterServer::Leave(int rank, uint64_t session) { return membership_.Leave(rank, session); }

absl::StatusOr<absl::Span<const float>> ParameterServer::PushedGradient(const Partition& p,
                                                                       const PushRequestView& r) {
  if (!r.dtype.has_value()) {
    return absl::InvalidArgumentError("gradients must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16");
  }
  const WireDType dtype = *r.dtype;
  const int64_t n = p.range.length;
  if (!r.sparse) {
    const int64_t bytes = n * WireDTypeBytes(dtype);
    if (static_cast<int64_t>(r.data.size()) != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition ", r.partition, " holds ", n, " floats (", bytes, " bytes",
          dtype == WireDType::kFloat32 ? "" : absl::StrCat(" of ", WireDTypeName(dtype)),
          "); the gradients sent are ", r.data.size(), " bytes"));
    }
    if (dtype == WireDType::kFloat32) return AsFloats(r.data);
  }
  // Grows to the largest partition once per thread (the data path's few threads), then reused.
  thread_local std::vector<float> decoded;
  if (static_cast<int64_t>(decoded.size()) < n) decoded.resize(n);
  const absl::Span<float> out(decoded.data(), n);
  if (r.sparse) {
    if (absl::Status s = DecodeSparse(dtype, r.data, out); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", r.partition, ": ", s.message()));
    }
  } else {
    DecodeValues(dtype, r.data.data(), out);
  }
  return absl::Span<const float>(out);
}

absl::StatusOr<PushValues> ParameterServer::CheckValues(const PushRequestView& r, absl::Span<const float> values) {
  const int64_t bad = FirstNonFinite(values);
  if (bad < 0) return PushValues::kAsSent;
  nonfinite_pushes_.fetch_add(1, std::memory_order_relaxed);
  switch (options_.nonfinite) {
    case NonFinite::kReject:
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r.rank, " pushed a non-finite gradient for step ", r.step, ", partition ", r.partition,
          ": element ", bad, " is ", values[bad],
          r.dtype.has_value() && *r.dtype != WireDType::kFloat32 ? absl::StrCat(" (sent as ", WireDTypeName(*r.dtype), ")") : "",
          " (refused; --nonfinite=skip_step or zero would take it)"));
    case NonFinite::kSkipStep: return PushValues::kSkip;
    case NonFinite::kZero: return PushValues::kZeroNonFinite;
  }
  return PushValues::kAsSent;
}

absl::StatusOr<const ParameterServer::Model*> ParameterServer::ReadyModel() const {
  const Model* m = model();
  if (m == nullptr) return absl::FailedPreconditionError("no model yet: no worker has joined");
  if (const int pending = m->pending.load(std::memory_order_acquire); pending > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        pending, " of ", m->partitions.size(), " partitions have no initial values yet: the worker "
        "that defined the model sends them (Initialize) before anyone pushes or pulls"));
  }
  return m;
}

absl::StatusOr<Partition*> ParameterServer::Find(const Model& m, uint32_t id) const {
  if (id >= m.index_of.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown partition ", id, "; the model has ", m.index_of.size()));
  }
  if (m.index_of[id] < 0) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", id, " is held by shard ",
                                                   AssignShards(m.map.partitions(), options_.shards)[id],
                                                   ", not this one (shard ", options_.shard, " of ",
                                                   options_.shards, ")"));
  }
  return m.partitions[m.index_of[id]].get();
}

absl::StatusOr<Partition*> ParameterServer::PartitionFor(const Model& m, uint32_t partition, bool float32,
                                                         absl::string_view data, const char* what) {
  SUMMA_ASSIGN_OR_RETURN(Partition* const p, Find(m, partition));
  if (!float32) return absl::InvalidArgumentError(absl::StrCat(what, " must be float32 (DTYPE_FLOAT32)"));
  if (static_cast<int64_t>(data.size()) != p->range.length * 4) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " holds ", p->range.length,
                                                   " floats (", p->range.length * 4, " bytes); the ", what,
                                                   " sent are ", data.size(), " bytes"));
  }
  return p;
}

absl::StatusOr<bool> ParameterServer::Initialize(const InitializeView& request) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  const Model* m = model();
  if (m == nullptr) return absl::FailedPreconditionError("no model yet: Join with values_follow first");
  SUMMA_ASSIGN_OR_RETURN(Partition* const found,
                         PartitionFor(*m, request.partition, request.dtype_is_float32, request.data,
                                      "initial values"));
  Partition& p = *found;
  SUMMA_RETURN_IF_ERROR(membership_.Touch(request.rank, request.session));
  {
    absl::MutexLock lock(&p.mu);
    if (p.initialized) return false;
    std::memcpy(p.weights.data(), request.data.data(), request.data.size());
    p.initialized = true;
  }
  if (m->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    SUMMA_LOG(INFO) << "every partition has its initial values (" << m->partitions.size()
                    << " partitions, sent by rank " << request.rank << ")";
  }
  return true;
}

absl::StatusOr<bool> ParameterServer::Push(const PushRequestView& request) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  SUMMA_ASSIGN_OR_RETURN(const Model* m, ReadyModel());
  if (request.rank < 0 || request.rank >= options_.world_size) return membership_.Touch(request.rank, request.session);
  SUMMA_ASSIGN_OR_RETURN(Partition* const found, Find(*m, request.partition));
  Partition& p = *found;
  SUMMA_ASSIGN_OR_RETURN(const absl::Span<const float> gradient, PushedGradient(p, request));
  if (request.num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples must not be negative, got ", request.num_examples));
  }
  SUMMA_ASSIGN_OR_RETURN(const PushValues values, CheckValues(request, gradient));
  SUMMA_RETURN_IF_ERROR(membership_.Touch(request.rank, request.session));
  CallsToFinish released;
  absl::StatusOr<bool> applied;
  {
    TraceSpan span(options_.tracer, "sum", "server", p.range.id);
    absl::MutexLock lock(&p.mu);
    if (p.retired) return Gone(p);
    if (membership_.excluded(request.rank)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", request.rank, " is no longer in the group; its pushes are refused"));
    }
    // Checked under the partition's lock, which an exclusion takes to settle the step after it
    // moves the view on: a push is counted only if its worker, as it pushed, had heard of every
    // exclusion this server had made. Any other view than this server's is refused, not only an
    // older one: a follower's view may go back (shard 0 restarted and counts from 0 again).
    if (const uint64_t view = membership_.view(); request.view.has_value() && *request.view != view) {
      stale_view_pushes_.fetch_add(1, std::memory_order_relaxed);
      return WithReason(absl::AbortedError(absl::StrCat(
          "stale membership view: rank ", request.rank, "'s push of step ", request.step, " to partition ",
          p.range.id, " is stamped with view ", *request.view, ", and this server is at view ", view,
          " (a member has left or been dropped since, or shard 0 restarted): refresh the view (Heartbeat) "
          "and push again")), StatusReason::kStaleView);
    }
    applied = policy_->Push(p, request, gradient, values, options_.clock->Now(), released);
    if (applied.ok() && *applied) {
      MaybeFreeze(*m, p);
      if (restored_.load(std::memory_order_relaxed)) restored_.store(false, std::memory_order_release);
    }
  }
  if (absl::IsAlreadyExists(applied.status())) duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
  if (!applied.ok()) return applied;
  pushes_served_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(request.data.size(), std::memory_order_relaxed);
  membership_.CountPush(request.rank, request.num_examples);
  CountAnswers(released, p.range.length);
  released.FinishAll();
  return applied;
}

void ParameterServer::CountAnswers(const CallsToFinish& answered, int64_t floats) {
  pulls_served_.fetch_add(answered.size(), std::memory_order_relaxed);
  bytes_out_.fetch_add(answered.value_bytes() * floats, std::memory_order_relaxed);
}

void ParameterServer::PullFrom(const Model& m, uint32_t partition, uint64_t min_version,
                               std::shared_ptr<ParkedCall> call) {
  absl::StatusOr<Partition*> found = Find(m, partition);
  if (!found.ok()) {
    if (call->Claim()) call->Finish(found.status());
    return;
  }
  Partition& p = **found;
  CallsToFinish answer, refusal;
  {
    absl::MutexLock lock(&p.mu);
    if (p.retired) {
      if (call->Claim()) refusal.Add(std::move(call), Gone(p));
    } else if (p.version >= min_version) {
      if (!call->Claim()) return;
      call->Fill(p.version, p.Published());
      answer.Add(std::move(call), absl::OkStatus());
    } else if (absl::Status refused = policy_->CheckPull(p, min_version); !refused.ok()) {
      if (call->Claim()) refusal.Add(std::move(call), std::move(refused));
    } else if (absl::Status gone = Gone(p); !gone.ok()) {
      // Checked under the lock that FailParked and RollBack take: a call parked now would never
      // be failed.
      if (call->Claim()) refusal.Add(std::move(call), std::move(gone));
    } else {
      p.parked.Park(std::move(call), min_version, options_.clock->Now() + options_.barrier_deadline);
    }
  }
  CountAnswers(answer, p.range.length);
}

void ParameterServer::Pull(int rank, uint64_t session, uint32_t partition, uint64_t min_version,
                           std::shared_ptr<ParkedCall> call) {
  absl::Status ok = Answerable();
  absl::StatusOr<const Model*> m = ReadyModel();
  if (ok.ok()) ok = m.status();
  if (ok.ok() && rank != -1) ok = membership_.Touch(rank, session);
  if (!ok.ok()) {
    if (call->Claim()) call->Finish(ok);
    return;
  }
  PullFrom(**m, partition, min_version, std::move(call));
}

void ParameterServer::PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call) {
  absl::StatusOr<bool> pushed = Push(request);
  // A push that was already counted (a retry after a lost reply) only pulls.
  if (!pushed.ok() && !absl::IsAlreadyExists(pushed.status())) {
    if (call->Claim()) call->Finish(pushed.status());
    return;
  }
  const Model& m = *model();
  // A rollback since the push voided its session before it published this model.
  if (absl::Status s = membership_.CheckSession(request.rank, request.session); !s.ok()) {
    if (call->Claim()) call->Finish(s);
    return;
  }
  Partition& p = **Find(m, request.partition);  // found by the push above
  CallsToFinish answer, refusal;
  {
    absl::MutexLock lock(&p.mu);
    if (absl::Status gone = Gone(p); !gone.ok()) {
      if (call->Claim()) refusal.Add(std::move(call), std::move(gone));
    } else {
      policy_->AnswerPushPull(p, request.step, std::move(call),
                              options_.clock->Now() + options_.barrier_deadline, answer);
    }
  }
  CountAnswers(answer, p.range.length);
}

void ParameterServer::OnMembershipChange() {
  const Model* m = model();
  if (m == nullptr) return;
  if (membership_.job_ended()) {
    FailParked(absl::AbortedError(absl::StrCat("the job has ended: ", job_error())));
    return;
  }
  const absl::Time now = options_.clock->Now();
  for (const auto& p : m->partitions) {
    CallsToFinish released;
    {
      absl::MutexLock lock(&p->mu);
      if (p->retired) continue;  // a rollback replaced the model since it was read
      const uint64_t before = p->version;
      policy_->OnExcluded(*p, now, released);
      if (p->version != before) {
        MaybeFreeze(*m, *p);
        restored_.store(false, std::memory_order_release);
      }
    }
    CountAnswers(released, p->range.length);
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
                                                      absl::FormatDuration(options_.barrier_deadline),
                                                      " passed: ", policy_->WaitingFor(*p)));
    };
    p->parked.Expire(now, why, expired);
    p->clock_parked.Expire(now, why, expired);
  }
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

StatusSnapshot ParameterServer::Status() const {
  StatusSnapshot s;
  s.optimizer = optimizer_->Describe();
  s.uptime = options_.clock->Now() - started_;
  s.members = membership_.Snapshot();
  s.view = membership_.view();
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
    for (const auto& p : m->partitions) {
      s.partition_bytes_held += p->range.length * 4;
      absl::ReaderMutexLock lock(&p->mu);
      s.version = std::min(s.version, p->version);
      if (p->reports) {
        s.last_step = p->last_step;
        s.learning_rate = optimizer_->LearningRate(p->version);
      }
    }
  } else {
    s.learning_rate = optimizer_->LearningRate(0);
  }
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
