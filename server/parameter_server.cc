#include "server/parameter_server.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace summa::server {
namespace {

absl::Span<const float> AsFloats(absl::string_view bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

}  // namespace

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
  return SgdOptimizer::Validate(options.sgd);
}

ParameterServer::PartitionState::PartitionState(PartitionRange r, int world_size,
                                                absl::Span<const float> initial)
    : range(r),
      weights(initial.begin(), initial.end()),
      aggregator(r.length),
      barrier(world_size),
      last_completion(absl::Now()) {}

ParameterServer::ParameterServer(ServerOptions options)
    : options_(std::move(options)),
      optimizer_(options_.sgd),
      started_(absl::Now()),
      joined_(options_.world_size, false),
      members_(options_.world_size) {
  for (int r = 0; r < options_.world_size; ++r) members_[r].rank = r;
}

ParameterServer::~ParameterServer() { Shutdown(); }

std::shared_ptr<const ParameterServer::Model> ParameterServer::model() const {
  absl::ReaderMutexLock lock(&mu_);
  return model_;
}

absl::Status ParameterServer::DefineModel(const JoinRequestView& request) {
  std::vector<TensorSpec> specs;
  for (const JoinTensor& t : request.params) specs.push_back(t.spec);
  SUMMA_ASSIGN_OR_RETURN(PartitionMap map, PartitionMap::Create(specs, options_.partition_bytes));
  std::vector<float> flat(map.num_elements());
  for (size_t i = 0; i < request.params.size(); ++i) {
    const JoinTensor& t = request.params[i];
    if (static_cast<int64_t>(t.data.size()) != t.spec.num_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.spec.name, "' of shape ", ShapeString(t.spec.shape), " needs ",
          t.spec.num_bytes(), " bytes of float32 values, got ", t.data.size()));
    }
    std::memcpy(flat.data() + map.tensor_offset(i), t.data.data(), t.data.size());
  }
  auto model = std::make_shared<Model>(std::move(map));
  for (const PartitionRange& range : model->map.partitions()) {
    model->partitions.push_back(std::make_unique<PartitionState>(
        range, options_.world_size,
        absl::MakeConstSpan(flat.data() + range.offset, range.length)));
    if (options_.sgd.momentum > 0) model->partitions.back()->velocity.assign(range.length, 0.0f);
  }
  model_ = std::move(model);
  SUMMA_LOG(INFO) << "model defined by rank " << request.rank << ": " << request.params.size()
                  << " tensors, " << model_->map.num_elements() << " parameters in "
                  << model_->partitions.size() << " partitions";
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
  if (shut_down_) return absl::UnavailableError("the server is shutting down");
  int rank = request.rank;
  if (rank == -1) {
    for (rank = 0; rank < options_.world_size && joined_[rank]; ++rank) {
    }
    if (rank == options_.world_size) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", options_.world_size, " ranks have joined already"));
    }
  }
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the group of ",
                                                   options_.world_size, " (ranks 0..",
                                                   options_.world_size - 1, ")"));
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
  if (joined_[rank]) {
    SUMMA_LOG(WARNING) << "rank " << rank << " joined again from " << request.peer;
  }
  joined_[rank] = true;
  MemberInfo& member = members_[rank];
  member.peer = request.peer;
  member.status_address = request.status_address;
  member.last_seen = absl::Now();
  JoinResult result;
  result.rank = rank;
  result.partitions = model_->map.partitions();
  result.version = UINT64_MAX;
  for (const auto& p : model_->partitions) {
    absl::ReaderMutexLock plock(&p->mu);
    result.version = std::min(result.version, p->version);
  }
  SUMMA_LOG(INFO) << "rank " << rank << " joined from " << request.peer << " at version "
                  << result.version;
  return result;
}

absl::Status ParameterServer::CheckMember(int rank) const {
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the group of ",
                                                   options_.world_size, " (ranks 0..",
                                                   options_.world_size - 1, ")"));
  }
  absl::ReaderMutexLock lock(&mu_);
  if (!joined_[rank]) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has not joined; call Join first"));
  }
  return absl::OkStatus();
}

void ParameterServer::Touch(int rank, const std::string& peer, uint64_t pushes, uint64_t examples) {
  absl::MutexLock lock(&mu_);
  MemberInfo& m = members_[rank];
  if (!peer.empty()) m.peer = peer;
  m.pushes += pushes;
  m.examples += examples;
  m.last_seen = absl::Now();
}

std::string ParameterServer::WaitingFor(const PartitionState& state) const {
  std::vector<int> missing = state.barrier.Missing();
  return absl::StrCat("partition ", state.range.id, " is at version ", state.version,
                      "; step ", state.version, " still waits for pushes from rank",
                      missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "));
}

absl::StatusOr<bool> ParameterServer::Push(const PushRequestView& request) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return absl::FailedPreconditionError("no model yet: no worker has joined");
  SUMMA_RETURN_IF_ERROR(CheckMember(request.rank));
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
  CallsToFinish released;
  bool completed = false;
  {
    absl::MutexLock lock(&state.mu);
    if (request.step < state.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", request.step, " of partition ", request.partition,
          " is finished (the partition is at version ", state.version, ")"));
    }
    if (request.step > state.version) {
      return absl::OutOfRangeError(absl::StrCat("step ", request.step, " is in the future: partition ",
                                                request.partition, " is at step ", state.version));
    }
    const absl::Time now = absl::Now();
    absl::StatusOr<bool> all = state.barrier.Arrive(request.rank, now);
    if (!all.ok()) {
      if (absl::IsAlreadyExists(all.status())) {
        return absl::AlreadyExistsError(absl::StrCat("rank ", request.rank, " already pushed partition ",
                                                     request.partition, " for step ", request.step,
                                                     "; the duplicate was not counted"));
      }
      return all.status();
    }
    state.aggregator.Add(AsFloats(request.data), request.num_examples);
    if (*all) {
      optimizer_.Apply(absl::MakeSpan(state.weights), absl::MakeSpan(state.velocity),
                       state.aggregator.sum(), state.aggregator.num_examples());
      state.aggregator.Reset();
      state.barrier.Reset();
      ++state.version;
      state.last_step = now - state.last_completion;
      state.last_completion = now;
      state.parked.Release(state.version, state.weights, released);
      completed = true;
    }
  }
  pushes_served_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(request.data.size(), std::memory_order_relaxed);
  pulls_served_.fetch_add(released.size(), std::memory_order_relaxed);
  bytes_out_.fetch_add(released.size() * state.range.length * 4, std::memory_order_relaxed);
  Touch(request.rank, request.peer, 1, request.num_examples);
  released.FinishAll();
  return completed;
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
    } else if (min_version > state.version + 1) {
      if (call->Claim()) {
        answer.Add(std::move(call),
                   absl::OutOfRangeError(absl::StrCat(
                       "version ", min_version, " of partition ", partition,
                       " is more than one step ahead of the current version ", state.version)));
      }
    } else if (shut_down_) {
      if (call->Claim()) answer.Add(std::move(call), absl::UnavailableError("the server is shutting down"));
    } else {
      state.parked.Park(std::move(call), min_version, absl::Now() + options_.barrier_deadline);
    }
  }
  answer.FinishAll();
}

void ParameterServer::Pull(int rank, uint32_t partition, uint64_t min_version,
                           const std::string& peer, std::shared_ptr<ParkedCall> call) {
  std::shared_ptr<const Model> m = model();
  absl::Status ok = m == nullptr ? absl::FailedPreconditionError("no model yet: no worker has joined")
                    : rank == -1 ? absl::OkStatus()
                                 : CheckMember(rank);
  if (!ok.ok()) {
    if (call->Claim()) call->Finish(ok);
    return;
  }
  if (rank >= 0) Touch(rank, peer, 0, 0);
  PullFrom(*m, partition, min_version, std::move(call));
}

void ParameterServer::PushPull(const PushRequestView& request, std::shared_ptr<ParkedCall> call) {
  absl::StatusOr<bool> pushed = Push(request);
  if (!pushed.ok()) {
    if (call->Claim()) call->Finish(pushed.status());
    return;
  }
  PullFrom(*model(), request.partition, request.step + 1, std::move(call));
}

absl::Time ParameterServer::ExpireParked(absl::Time now) {
  std::shared_ptr<const Model> m = model();
  absl::Time next = absl::InfiniteFuture();
  if (m == nullptr) return next;
  CallsToFinish expired;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    p->parked.Expire(
        now,
        [&] {
          return absl::DeadlineExceededError(absl::StrCat(
              "barrier deadline of ", absl::FormatDuration(options_.barrier_deadline),
              " passed: ", WaitingFor(*p)));
        },
        expired);
    next = std::min(next, p->parked.earliest_deadline());
  }
  expired.FinishAll();
  return next;
}

void ParameterServer::Shutdown() {
  shut_down_ = true;
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return;
  CallsToFinish failed;
  for (const auto& p : m->partitions) {
    absl::MutexLock lock(&p->mu);
    p->parked.FailAll(absl::UnavailableError("the server is shutting down"), failed);
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
    for (int r = 0; r < options_.world_size; ++r) {
      if (joined_[r]) s.members.push_back(members_[r]);
    }
  }
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
