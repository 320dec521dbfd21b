#include "server/parameter_server.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/checkpoint.h"

namespace summa::server {
namespace {

absl::Span<const float> AsFloats(absl::string_view bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

std::string RankRange(int world_size) {
  return absl::StrCat("the group of ", world_size, " (ranks 0..", world_size - 1, ")");
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kSync: return "sync";
    case Mode::kAsync: return "async";
    case Mode::kSsp: return "ssp";
  }
  return "?";
}

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kAbsent: return "absent";
    case MemberState::kAlive: return "alive";
    case MemberState::kLapsed: return "lapsed";
    case MemberState::kLeft: return "left";
    case MemberState::kDropped: return "dropped";
  }
  return "?";
}

absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of workers must be at least 1, got ", options.world_size));
  }
  if (options.partition_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition size must be at least 4 bytes, got ", options.partition_bytes));
  }
  if (options.barrier_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the barrier deadline must be positive");
  }
  if (options.lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("the lease must be positive");
  if (options.rejoin_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the rejoin deadline must be positive");
  }
  if (options.staleness < 0) return absl::InvalidArgumentError("staleness must not be negative");
  if (options.checkpoint_every < 0) {
    return absl::InvalidArgumentError("the checkpoint interval must not be negative");
  }
  return SgdOptimizer::Validate(options.sgd);
}

ParameterServer::PartitionState::PartitionState(PartitionRange r, int world_size,
                                                absl::Span<const float> initial)
    : range(r),
      weights(initial.begin(), initial.end()),
      aggregator(r.length),
      barrier(world_size),
      next_step(world_size, 0),
      last_completion(absl::Now()) {}

ParameterServer::ParameterServer(ServerOptions options)
    : options_(std::move(options)),
      optimizer_(options_.sgd),
      started_(absl::Now()),
      members_(options_.world_size),
      excluded_(options_.world_size) {
  for (int r = 0; r < options_.world_size; ++r) {
    members_[r].rank = r;
    excluded_[r] = false;
  }
}

ParameterServer::~ParameterServer() { Shutdown(); }

std::shared_ptr<const ParameterServer::Model> ParameterServer::model() const {
  absl::ReaderMutexLock lock(&mu_);
  return model_;
}

std::vector<int> ParameterServer::LiveRanks() const {
  std::vector<int> live;
  for (int r = 0; r < options_.world_size; ++r) {
    if (!excluded_[r].load()) live.push_back(r);
  }
  return live;
}

std::string ParameterServer::job_error() const {
  absl::MutexLock lock(&error_mu_);
  return job_error_;
}

absl::Status ParameterServer::Answerable() const {
  if (job_ended_) return absl::AbortedError(absl::StrCat("the job has ended: ", job_error()));
  if (shut_down_) return absl::UnavailableError("the server is shutting down");
  return absl::OkStatus();
}

absl::Status ParameterServer::BuildModel(std::vector<TensorSpec> specs, const std::vector<float>& flat) {
  SUMMA_ASSIGN_OR_RETURN(PartitionMap map, PartitionMap::Create(std::move(specs), options_.partition_bytes));
  if (static_cast<int64_t>(flat.size()) != map.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", map.num_elements(),
                                                   " parameters but ", flat.size(), " values came"));
  }
  auto model = std::make_shared<Model>(std::move(map));
  for (const PartitionRange& range : model->map.partitions()) {
    model->partitions.push_back(std::make_unique<PartitionState>(
        range, options_.world_size, absl::MakeConstSpan(flat.data() + range.offset, range.length)));
    if (options_.sgd.momentum > 0) model->partitions.back()->velocity.assign(range.length, 0.0f);
  }
  model_ = std::move(model);
  return absl::OkStatus();
}

absl::Status ParameterServer::DefineModel(const JoinRequestView& request) {
  std::vector<TensorSpec> specs;
  int64_t total = 0;
  for (const JoinTensor& t : request.params) {
    specs.push_back(t.spec);
    if (static_cast<int64_t>(t.data.size()) != t.spec.num_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.spec.name, "' of shape ", ShapeString(t.spec.shape), " needs ",
          t.spec.num_bytes(), " bytes of float32 values, got ", t.data.size()));
    }
    total += t.spec.num_elements();
  }
  std::vector<float> flat(total);
  int64_t offset = 0;
  for (const JoinTensor& t : request.params) {
    std::memcpy(flat.data() + offset, t.data.data(), t.data.size());
    offset += t.spec.num_elements();
  }
  SUMMA_RETURN_IF_ERROR(BuildModel(std::move(specs), flat));
  SUMMA_LOG(INFO) << "model defined by rank " << request.rank << ": " << request.params.size()
                  << " tensors, " << model_->map.num_elements() << " parameters in "
                  << model_->partitions.size() << " partitions";
  return absl::OkStatus();
}

absl::Status ParameterServer::Restore(const summa::v1::Checkpoint& c) {
  if (c.world_size() != options_.world_size) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint is of a job of ", c.world_size(),
                                                      " workers; the server was started for ",
                                                      options_.world_size));
  }
  if (c.partition_bytes() != options_.partition_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint was cut in partitions of ",
                                                      c.partition_bytes(), " bytes; --partition_bytes is ",
                                                      options_.partition_bytes));
  }
  std::vector<TensorSpec> specs;
  for (const summa::v1::Tensor& t : c.params()) {
    specs.push_back({t.name(), DType::kFloat32, std::vector<int64_t>(t.shape().begin(), t.shape().end())});
  }
  std::vector<float> flat(c.weights().size() / 4);
  std::memcpy(flat.data(), c.weights().data(), flat.size() * 4);
  absl::MutexLock lock(&mu_);
  if (model_ != nullptr) return absl::FailedPreconditionError("the model is already defined");
  SUMMA_RETURN_IF_ERROR(BuildModel(std::move(specs), flat));
  const bool has_velocity = options_.sgd.momentum > 0 && c.velocity().size() == c.weights().size();
  for (auto& p : model_->partitions) {
    absl::MutexLock plock(&p->mu);
    p->version = c.version();
    if (has_velocity) {
      std::memcpy(p->velocity.data(), c.velocity().data() + p->range.offset * 4, p->range.length * 4);
    }
    for (int r = 0; r < options_.world_size && r < c.next_steps_size(); ++r) {
      p->next_step[r] = c.next_steps(r);
    }
  }
  checkpoint_.version = c.version();
  checkpoint_.written = absl::FromUnixSeconds(c.created_unix_seconds());
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckSameModel(const JoinRequestView& request) const {
  const std::vector<TensorSpec>& ours = model_->map.specs();
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
  for (const JoinTensor& t : request.params) {
    absl::Status shape = ValidateShape(t.spec.shape);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.spec.name, "': ", shape.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  int rank = request.rank;
  if (rank == -1) {
    for (rank = 0; rank < options_.world_size && members_[rank].state != MemberState::kAbsent; ++rank) {
    }
    if (rank == options_.world_size) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", options_.world_size, " ranks have joined already; pass --rank to rejoin"));
    }
  }
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside ", RankRange(options_.world_size)));
  }
  MemberInfo& member = members_[rank];
  if (member.state == MemberState::kDropped || member.state == MemberState::kLeft) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " ", member.state == MemberState::kDropped ? "was dropped from" : "left",
        " the group; the job goes on without it"));
  }
  if (model_ == nullptr) {
    const bool has_values =
        !request.params.empty() &&
        std::all_of(request.params.begin(), request.params.end(),
                    [](const JoinTensor& t) { return !t.data.empty(); });
    if (!has_values) {
      return absl::UnavailableError(absl::StrCat(
          "no model yet: rank ", rank, " must wait until a worker (rank 0) joins with the "
          "initial values; retry"));
    }
    SUMMA_RETURN_IF_ERROR(DefineModel(request));
  } else {
    SUMMA_RETURN_IF_ERROR(CheckSameModel(request));
  }
  const absl::Time now = absl::Now();
  if (member.state == MemberState::kAlive) {
    SUMMA_LOG(WARNING) << "rank " << rank << " joined again from " << request.peer
                       << " while its lease was still valid (a restart?)";
  } else if (member.state == MemberState::kLapsed) {
    SUMMA_LOG(INFO) << "rank " << rank << " rejoined from " << request.peer << " after "
                    << absl::FormatDuration(now - member.lapsed_at);
  }
  member.state = MemberState::kAlive;
  member.peer = request.peer;
  member.status_address = request.status_address;
  member.last_seen = now;
  member.lease_expiry = now + options_.lease;
  ++member.joins;
  JoinResult result;
  result.rank = rank;
  result.partitions = model_->map.partitions();
  result.version = UINT64_MAX;
  result.next_step = UINT64_MAX;
  for (const auto& p : model_->partitions) {
    absl::ReaderMutexLock plock(&p->mu);
    result.version = std::min(result.version, p->version);
    result.next_step = std::min(result.next_step, p->next_step[rank]);
  }
  if (options_.mode == Mode::kSync) result.next_step = result.version;
  result.live_ranks = LiveRanks();
  SUMMA_LOG(INFO) << "rank " << rank << " joined from " << request.peer << " at version "
                  << result.version << " (" << ModeName(options_.mode) << " mode)";
  return result;
}

absl::Status ParameterServer::CheckMember(int rank, const std::string& peer, uint64_t pushes,
                                          uint64_t examples) {
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside ", RankRange(options_.world_size)));
  }
  absl::MutexLock lock(&mu_);
  MemberInfo& m = members_[rank];
  switch (m.state) {
    case MemberState::kAbsent:
      return absl::NotFoundError(absl::StrCat(
          "rank ", rank, " is not a member (never joined, or the server restarted); Join again"));
    case MemberState::kDropped:
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " was dropped from the group when its lease lapsed; its pushes are refused"));
    case MemberState::kLeft:
      return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " left the group"));
    case MemberState::kLapsed:
      SUMMA_LOG(INFO) << "rank " << rank << " is back after its lease lapsed";
      m.state = MemberState::kAlive;
      break;
    case MemberState::kAlive:
      break;
  }
  const absl::Time now = absl::Now();
  if (!peer.empty()) m.peer = peer;
  m.pushes += pushes;
  m.examples += examples;
  m.last_seen = now;
  m.lease_expiry = now + options_.lease;
  return absl::OkStatus();
}

absl::Status ParameterServer::Heartbeat(int rank, const std::string& peer) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  return CheckMember(rank, peer, 0, 0);
}

absl::Status ParameterServer::Leave(int rank) {
  SUMMA_RETURN_IF_ERROR(CheckMember(rank, "", 0, 0));
  {
    absl::MutexLock lock(&mu_);
    members_[rank].state = MemberState::kLeft;
  }
  SUMMA_LOG(INFO) << "rank " << rank << " left the group";
  Exclude({rank});
  return absl::OkStatus();
}

std::string ParameterServer::WaitingFor(const PartitionState& state) const {
  std::vector<int> missing;
  for (int r : state.barrier.Missing()) {
    if (!excluded_[r]) missing.push_back(r);
  }
  return absl::StrCat("partition ", state.range.id, " is at version ", state.version,
                      "; step ", state.version, " still waits for pushes from rank",
                      missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "));
}

void ParameterServer::MaybeCompleteStep(PartitionState& state, absl::Time now, CallsToFinish& out) {
  if (state.barrier.arrived() == 0) return;  // nothing pushed: an exclusion completes nothing
  for (int r = 0; r < options_.world_size; ++r) {
    if (!excluded_[r] && !state.barrier.has_arrived(r)) return;
  }
  optimizer_.Apply(absl::MakeSpan(state.weights), absl::MakeSpan(state.velocity),
                   state.aggregator.sum(), state.aggregator.num_examples());
  state.aggregator.Reset();
  state.barrier.Reset();
  ++state.version;
  state.last_step = now - state.last_completion;
  state.last_completion = now;
  if (state.range.id == 0 && options_.step_observer) options_.step_observer(state.last_step);
  state.parked.Release(state.version, state.weights, out);
}

uint64_t ParameterServer::SlowestStep(const PartitionState& state) const {
  uint64_t slowest = UINT64_MAX;
  for (int r = 0; r < options_.world_size; ++r) {
    if (!excluded_[r]) slowest = std::min(slowest, state.next_step[r]);
  }
  return slowest;
}

absl::StatusOr<bool> ParameterServer::Push(const PushRequestView& request) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return absl::FailedPreconditionError("no model yet: no worker has joined");
  if (request.rank < 0 || request.rank >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank, " is outside ", RankRange(options_.world_size)));
  }
  if (request.partition >= m->partitions.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown partition ", request.partition,
                                                   "; the model has ", m->partitions.size()));
  }
  PartitionState& state = *m->partitions[request.partition];
  if (!request.dtype_is_float32) {
    return absl::InvalidArgumentError("gradients must be float32 (DTYPE_FLOAT32)");
  }
  if (static_cast<int64_t>(request.data.size()) != state.range.length * 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition ", request.partition, " holds ", state.range.length, " floats (",
        state.range.length * 4, " bytes); the push carries ", request.data.size(), " bytes"));
  }
  if (request.num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples must not be negative, got ", request.num_examples));
  }
  SUMMA_RETURN_IF_ERROR(CheckMember(request.rank, request.peer, 0, 0));
  CallsToFinish released;
  bool applied = false;
  {
    absl::MutexLock lock(&state.mu);
    const absl::Time now = absl::Now();
    if (options_.mode == Mode::kSync) {
      if (request.step < state.version) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", request.step, " of partition ", request.partition,
            " is finished (the partition is at version ", state.version, ")"));
      }
      if (request.step > state.version) {
        return absl::OutOfRangeError(absl::StrCat("step ", request.step, " is in the future: partition ",
                                                  request.partition, " is at step ", state.version));
      }
      if (state.barrier.has_arrived(request.rank)) {
        duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
        return absl::AlreadyExistsError(absl::StrCat("rank ", request.rank, " already pushed partition ",
                                                     request.partition, " for step ", request.step,
                                                     "; the duplicate was not counted"));
      }
      if (!state.barrier.Arrive(request.rank, now).ok()) {
        return absl::InternalError("barrier refused a checked arrival");
      }
      state.aggregator.Add(AsFloats(request.data), request.num_examples);
      const uint64_t before = state.version;
      MaybeCompleteStep(state, now, released);
      applied = state.version != before;
    } else {
      uint64_t& next = state.next_step[request.rank];
      if (request.step < next) {
        duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
        return absl::AlreadyExistsError(absl::StrCat("rank ", request.rank, " already pushed partition ",
                                                     request.partition, " for step ", request.step,
                                                     "; the duplicate was not counted"));
      }
      if (request.step > next) {
        return absl::OutOfRangeError(absl::StrCat("rank ", request.rank, " pushed step ", request.step,
                                                  " of partition ", request.partition,
                                                  " but its next step is ", next));
      }
      // Async and ssp apply each push alone, divided by its own examples.
      optimizer_.Apply(absl::MakeSpan(state.weights), absl::MakeSpan(state.velocity),
                       AsFloats(request.data), request.num_examples);
      ++next;
      ++state.version;
      state.last_step = now - state.last_completion;
      state.last_completion = now;
      state.parked.Release(state.version, state.weights, released);
      state.clock_parked.Release(SlowestStep(state), state.version, state.weights, released);
      applied = true;
    }
  }
  pushes_served_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(request.data.size(), std::memory_order_relaxed);
  pulls_served_.fetch_add(released.size(), std::memory_order_relaxed);
  bytes_out_.fetch_add(released.size() * state.range.length * 4, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    members_[request.rank].pushes += 1;
    members_[request.rank].examples += request.num_examples;
  }
  released.FinishAll();
  return applied;
}

void ParameterServer::PullFrom(const Model& m, uint32_t partition, uint64_t min_version,
                               std::shared_ptr<ParkedCall> call) {
  if (partition >= m.partitions.size()) {
    if (call->Claim()) {
      call->Finish(absl::InvalidArgumentError(absl::StrCat(
          "unknown partition ", partition, "; the model has ", m.partitions.size())));
    }
    return;
  }
  PartitionState& state = *m.partitions[partition];
  CallsToFinish answer;
  {
    absl::MutexLock lock(&state.mu);
    if (state.version >= min_version) {
      if (!call->Claim()) return;
      call->Fill(state.version, state.weights);
      answer.Add(std::move(call), absl::OkStatus());
      pulls_served_.fetch_add(1, std::memory_order_relaxed);
      bytes_out_.fetch_add(state.range.length * 4, std::memory_order_relaxed);
    } else if (options_.mode == Mode::kSync && min_version > state.version + 1) {
      if (call->Claim()) {
        answer.Add(std::move(call),
                   absl::OutOfRangeError(absl::StrCat(
                       "version ", min_version, " of partition ", partition,
                       " is more than one step ahead of the current version ", state.version)));
      }
    } else if (absl::Status refused = Answerable(); !refused.ok()) {
      if (call->Claim()) answer.Add(std::move(call), std::move(refused));
    } else {
      state.parked.Park(std::move(call), min_version, absl::Now() + options_.barrier_deadline);
    }
  }
  answer.FinishAll();
}

void ParameterServer::Pull(int rank, uint32_t partition, uint64_t min_version,
                           const std::string& peer, std::shared_ptr<ParkedCall> call) {
  std::shared_ptr<const Model> m = model();
  absl::Status ok = Answerable();
  if (ok.ok() && m == nullptr) ok = absl::FailedPreconditionError("no model yet: no worker has joined");
  if (ok.ok() && rank != -1) ok = CheckMember(rank, peer, 0, 0);
  if (!ok.ok()) {
    if (call->Claim()) call->Finish(ok);
    return;
  }
  PullFrom(*m, partition, min_version, std::move(call));
}

void ParameterServer::PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call) {
  absl::StatusOr<bool> pushed = Push(request);
  // A push that was already counted (a retry after a lost reply) only pulls.
  if (!pushed.ok() && !absl::IsAlreadyExists(pushed.status())) {
    if (call->Claim()) call->Finish(pushed.status());
    return;
  }
  std::shared_ptr<const Model> m = model();
  if (options_.mode == Mode::kSync) {
    PullFrom(*m, request.partition, request.step + 1, std::move(call));
    return;
  }
  PartitionState& state = *m->partitions[request.partition];
  CallsToFinish answer;
  {
    absl::MutexLock lock(&state.mu);
    // ssp: wait until the slowest member has pushed step `step - staleness`; async never waits.
    const uint64_t need = options_.mode == Mode::kSsp && request.step + 1 > uint64_t(options_.staleness)
                              ? request.step + 1 - options_.staleness
                              : 0;
    if (SlowestStep(state) >= need) {
      if (!call->Claim()) return;
      call->Fill(state.version, state.weights);
      answer.Add(std::move(call), absl::OkStatus());
      pulls_served_.fetch_add(1, std::memory_order_relaxed);
      bytes_out_.fetch_add(state.range.length * 4, std::memory_order_relaxed);
    } else {
      state.clock_parked.Park(std::move(call), need, absl::Now() + options_.barrier_deadline);
    }
  }
  answer.FinishAll();
}

void ParameterServer::Exclude(const std::vector<int>& ranks) {
  std::shared_ptr<const Model> m = model();
  CallsToFinish released;
  if (m == nullptr) {
    for (int r : ranks) excluded_[r] = true;
    return;
  }
  // Hold every partition lock while the set changes, so that each step sees one membership.
  for (const auto& p : m->partitions) p->mu.Lock();
  for (int r : ranks) excluded_[r] = true;
  const absl::Time now = absl::Now();
  for (const auto& p : m->partitions) {
    if (options_.mode == Mode::kSync) {
      MaybeCompleteStep(*p, now, released);
    } else {
      p->clock_parked.Release(SlowestStep(*p), p->version, p->weights, released);
    }
  }
  for (auto it = m->partitions.rbegin(); it != m->partitions.rend(); ++it) (*it)->mu.Unlock();
  pulls_served_.fetch_add(released.size(), std::memory_order_relaxed);
}

void ParameterServer::EndJob(const std::string& why) {
  {
    absl::MutexLock lock(&error_mu_);
    if (!job_error_.empty()) return;
    job_error_ = why;
  }
  job_ended_ = true;
  SUMMA_LOG(ERROR) << "ending the job: " << why;
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return;
  CallsToFinish failed;
  const absl::Status status = absl::AbortedError(absl::StrCat("the job has ended: ", why));
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    p->parked.FailAll(status, failed);
    p->clock_parked.FailAll(status, failed);
  }
}

void ParameterServer::Tick(absl::Time now) {
  std::vector<int> dropped;
  std::string end_job;
  {
    absl::MutexLock lock(&mu_);
    for (MemberInfo& m : members_) {
      if (m.state == MemberState::kAlive && m.lease_expiry <= now) {
        m.state = MemberState::kLapsed;
        m.lapsed_at = now;
        SUMMA_LOG(WARNING) << "rank " << m.rank << " lost: no call for "
                           << absl::FormatDuration(options_.lease) << " (lease lapsed); "
                           << (options_.on_worker_loss == OnWorkerLoss::kShrink
                                   ? "dropping it and going on without it"
                                   : absl::StrCat("waiting up to ", absl::FormatDuration(options_.rejoin_deadline),
                                                  " for it to rejoin"));
        if (options_.on_worker_loss == OnWorkerLoss::kShrink) {
          m.state = MemberState::kDropped;
          dropped.push_back(m.rank);
        }
      }
      if (m.state == MemberState::kLapsed && end_job.empty() &&
          now - m.lapsed_at >= options_.rejoin_deadline) {
        end_job = absl::StrCat("rank ", m.rank, " was lost (lease lapsed ",
                               absl::FormatDuration(now - m.lapsed_at),
                               " ago) and did not rejoin within --rejoin_deadline=",
                               absl::FormatDuration(options_.rejoin_deadline));
      }
    }
  }
  if (!dropped.empty()) Exclude(dropped);
  if (!end_job.empty()) EndJob(end_job);

  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return;
  CallsToFinish expired;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    auto why = [&] {
      return absl::DeadlineExceededError(absl::StrCat(
          "barrier deadline of ", absl::FormatDuration(options_.barrier_deadline), " passed: ",
          options_.mode == Mode::kSync
              ? WaitingFor(*p)
              : absl::StrCat("the slowest member of partition ", p->range.id, " is at step ",
                             SlowestStep(*p))));
    };
    p->parked.Expire(now, why, expired);
    p->clock_parked.Expire(now, why, expired);
  }
}

absl::Status ParameterServer::MaybeCheckpoint(bool force) {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  absl::MutexLock checkpoint_lock(&checkpoint_mu_);
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return absl::OkStatus();
  uint64_t last;
  {
    absl::ReaderMutexLock lock(&mu_);
    last = checkpoint_.version;
  }
  summa::v1::Checkpoint c;
  {
    for (const auto& p : m->partitions) p->mu.Lock();
    uint64_t low = UINT64_MAX, high = 0;
    for (const auto& p : m->partitions) {
      low = std::min(low, p->version);
      high = std::max(high, p->version);
    }
    const bool due = force || (options_.checkpoint_every > 0 &&
                               low >= last + static_cast<uint64_t>(options_.checkpoint_every));
    absl::Status consistent = absl::OkStatus();
    if (options_.mode == Mode::kSync && low != high) {
      consistent = absl::FailedPreconditionError("partitions are between versions; retry");
    }
    if (due && consistent.ok() && (low != last || force)) {
      c.set_version(low);
      std::string* weights = c.mutable_weights();
      std::string* velocity = c.mutable_velocity();
      for (const auto& p : m->partitions) {
        weights->append(reinterpret_cast<const char*>(p->weights.data()), p->weights.size() * 4);
        velocity->append(reinterpret_cast<const char*>(p->velocity.data()), p->velocity.size() * 4);
      }
      for (int r = 0; r < options_.world_size; ++r) {
        uint64_t next = UINT64_MAX;
        for (const auto& p : m->partitions) next = std::min(next, p->next_step[r]);
        c.add_next_steps(next);
      }
    }
    for (auto it = m->partitions.rbegin(); it != m->partitions.rend(); ++it) (*it)->mu.Unlock();
    if (!due) return absl::OkStatus();
    if (!consistent.ok()) return consistent;
    if (c.weights().empty()) return absl::OkStatus();  // nothing new since the last one
  }
  c.set_world_size(options_.world_size);
  c.set_mode(options_.mode == Mode::kSync    ? summa::v1::MODE_SYNC
             : options_.mode == Mode::kAsync ? summa::v1::MODE_ASYNC
                                             : summa::v1::MODE_SSP);
  c.set_partition_bytes(options_.partition_bytes);
  c.set_optimizer(optimizer_.Describe());
  c.set_created_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  for (const TensorSpec& s : m->map.specs()) {
    summa::v1::Tensor* t = c.add_params();
    t->set_name(s.name);
    t->set_dtype(summa::v1::DTYPE_FLOAT32);
    for (int64_t d : s.shape) t->add_shape(d);
  }
  absl::StatusOr<std::string> path = WriteCheckpoint(options_.checkpoint_dir, c);
  if (!path.ok()) return path.status();
  absl::MutexLock lock(&mu_);
  checkpoint_ = {*path, c.version(), absl::Now()};
  SUMMA_LOG(INFO) << "checkpoint at version " << c.version() << " written to " << *path;
  return absl::OkStatus();
}

void ParameterServer::Shutdown() {
  shut_down_ = true;
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return;
  CallsToFinish failed;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    p->parked.FailAll(absl::UnavailableError("the server is shutting down"), failed);
    p->clock_parked.FailAll(absl::UnavailableError("the server is shutting down"), failed);
  }
}

StatusSnapshot ParameterServer::Status() const {
  StatusSnapshot s;
  s.mode = options_.mode;
  s.world_size = options_.world_size;
  s.partition_bytes = options_.partition_bytes;
  s.optimizer = optimizer_.Describe();
  s.uptime = absl::Now() - started_;
  std::shared_ptr<const Model> m;
  {
    absl::ReaderMutexLock lock(&mu_);
    m = model_;
    for (const MemberInfo& member : members_) {
      if (member.state != MemberState::kAbsent) s.members.push_back(member);
    }
    s.checkpoint = checkpoint_;
  }
  s.job_error = job_error();
  if (m != nullptr) {
    s.model_defined = true;
    s.params = m->map.specs();
    s.parameter_count = m->map.num_elements();
    s.partition_count = static_cast<int>(m->partitions.size());
    s.version = UINT64_MAX;
    for (const auto& p : m->partitions) {
      absl::ReaderMutexLock lock(&p->mu);
      s.version = std::min(s.version, p->version);
      if (p->range.id == 0) s.last_step = p->last_step;
    }
  }
  s.bytes_in = bytes_in_.load();
  s.bytes_out = bytes_out_.load();
  s.pushes_served = pushes_served_.load();
  s.pulls_served = pulls_served_.load();
  s.duplicate_pushes = duplicate_pushes_.load();
  return s;
}

std::vector<float> ParameterServer::WeightsForTest() const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return {};
  std::vector<float> flat;
  flat.reserve(m->map.num_elements());
  for (const auto& p : m->partitions) {
    absl::ReaderMutexLock lock(&p->mu);
    flat.insert(flat.end(), p->weights.begin(), p->weights.end());
  }
  return flat;
}

}  // namespace summa::server
