// ParameterServer's data path: initial values, pushes (checked, decoded from the wire dtype,
// applied under the consistency policy), pulls and push-pulls parked until their version. The
// model and its members are server/core/parameter_server.cc; checkpoints
// parameter_server_checkpoint.cc.
#include "server/core/parameter_server.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/compression.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/vector_ops.h"

namespace summa::server {
namespace {

absl::Span<const float> AsFloats(absl::string_view bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

}  // namespace

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
  SUMMA_ASSIGN_OR_RETURN(PushValues values, CheckValues(request, gradient));
  // Checked values read again to be summed may have changed meanwhile where the sender shares
  // them (PushRequestView::shared): the sum takes only finite ones.
  if (request.shared && values == PushValues::kAsSent) values = PushValues::kZeroNonFinite;
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
      p.parked.Park(std::move(call), min_version, options_.clock->Now() + BarrierDeadline());
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
  // A push that was already counted (a retry after a lost reply) only pulls. A late one (backup
  // workers: its step completed without it) was dropped, and pulls the newest weights, which its
  // step is past: the answer says so.
  const bool late = IsLatePush(pushed.status());
  if (!pushed.ok() && !absl::IsAlreadyExists(pushed.status()) && !late) {
    if (call->Claim()) call->Finish(pushed.status());
    return;
  }
  if (late) call->MarkLate();
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
      policy_->AnswerPushPull(p, request.rank, request.step, std::move(call),
                              options_.clock->Now() + BarrierDeadline(), answer);
    }
  }
  CountAnswers(answer, p.range.length);
}

}  // namespace summa::server

namespace summa::server {

absl::StatusOr<EmbeddingTable*> ParameterServer::Table(uint32_t table) const {
  SUMMA_ASSIGN_OR_RETURN(const Model* m, ReadyModel());
  if (table >= m->tables.size()) {
    std::vector<std::string> names;
    for (const auto& t : m->tables) names.push_back(absl::StrCat("'", t->name(), "'"));
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding table ", table, " is not declared: the job has ", m->tables.size(), " table(s)",
        names.empty() ? "" : absl::StrCat(" (", absl::StrJoin(names, ", "), ")")));
  }
  return m->tables[table].get();
}

void ParameterServer::SparsePull(SparsePullView request, std::shared_ptr<ParkedCall> call) {
  absl::Status ok = Answerable();
  absl::StatusOr<EmbeddingTable*> table = absl::InternalError("unset");
  if (ok.ok()) {
    table = Table(request.table);
    ok = table.status();
  }
  if (ok.ok()) ok = membership_.Touch(request.rank, request.session);
  if (ok.ok()) ok = (*table)->CheckIds(request.ids);
  const int64_t floats = static_cast<int64_t>(request.ids.size()) * (ok.ok() ? (*table)->dim() : 0);
  // The answer is allocated (and its rows created) before it is sent: one past the message
  // limit is refused before any of that.
  if (ok.ok() && floats * static_cast<int64_t>(sizeof(float)) > options_.limits.max_message_bytes - (64 << 10)) {
    ok = absl::InvalidArgumentError(absl::StrCat(
        "embedding table '", (*table)->name(), "': a pull of ", request.ids.size(), " rows of ", (*table)->dim(),
        " floats would answer ", floats * static_cast<int64_t>(sizeof(float)),
        " bytes, past summa-server --max_message_bytes=", options_.limits.max_message_bytes,
        " (less 64 KiB of headers): pull fewer rows at a time"));
  }
  if (!ok.ok()) {
    if (call->Claim()) call->Finish(ok);
    return;
  }
  CallsToFinish answered;
  (*table)->Pull(std::move(request.ids), request.min_version, options_.clock->Now() + BarrierDeadline(),
                 std::move(call), answered);
  CountAnswers(answered, floats);
}

absl::StatusOr<bool> ParameterServer::SparsePush(const SparsePushView& request) {
  SUMMA_RETURN_IF_ERROR(Answerable());
  SUMMA_ASSIGN_OR_RETURN(EmbeddingTable * table, Table(request.table));
  SUMMA_RETURN_IF_ERROR(membership_.Touch(request.rank, request.session));
  SUMMA_RETURN_IF_ERROR(table->CheckIds(request.ids));
  if (request.num_examples < 0 || request.num_examples > kMaxTableExamples) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", table->name(), "': num_examples ",
                                                   request.num_examples, " must be in [0, ", kMaxTableExamples, "]"));
  }
  // --nonfinite holds for rows as for partitions: a NaN kept in a row stays in it (and in its
  // optimizer state, and in checkpoints) for good.
  absl::Span<const float> grads = request.grads;
  bool skip = false;
  if (const int64_t bad = FirstNonFinite(grads); bad >= 0) {
    nonfinite_pushes_.fetch_add(1, std::memory_order_relaxed);
    const int dim = table->dim();
    switch (options_.nonfinite) {
      case NonFinite::kReject:
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", request.rank, " pushed a non-finite gradient for step ", request.step, " of embedding table '",
            table->name(), "': row ", request.ids[bad / dim], " holds ", grads[bad],
            " (refused; --nonfinite=skip_step or zero would take it)"));
      case NonFinite::kSkipStep:
        skip = true;
        break;
      case NonFinite::kZero: {
        thread_local std::vector<float> zeroed;
        zeroed.assign(grads.begin(), grads.end());
        for (float& v : zeroed) {
          if (!std::isfinite(v)) v = 0.0f;
        }
        grads = zeroed;
        break;
      }
    }
  }
  CallsToFinish released;
  absl::StatusOr<bool> completed =
      table->Push(request.rank, request.step, request.num_examples, request.ids, grads, released, skip);
  pulls_served_.fetch_add(released.size(), std::memory_order_relaxed);
  if (completed.ok()) {
    pushes_served_.fetch_add(1, std::memory_order_relaxed);
    bytes_in_.fetch_add(request.ids.size() * sizeof(uint64_t) + request.grads.size() * sizeof(float),
                        std::memory_order_relaxed);
  } else if (absl::IsAlreadyExists(completed.status())) {
    duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
  }
  return completed;
}

}  // namespace summa::server
