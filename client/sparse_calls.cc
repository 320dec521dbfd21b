#include "client/sparse_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/status_reason.h"

namespace summa::worker {

namespace pb = ::summa::v1;

namespace {

absl::Status UndeclaredTable(uint32_t table, size_t declared) {
  return absl::InvalidArgumentError(absl::StrCat("embedding table ", table, " is not declared: this client declares ",
                                                 declared, declared == 1 ? " table" : " tables",
                                                 " (set_tables, before Join), numbered from 0"));
}

}  // namespace

SparseCalls::SparseCalls(int shards, TransportSource source)
    : shards_(std::max(1, shards)),
      source_(std::move(source)),
      called_(shards_, false),
      outcome_(shards_),
      requests_(shards_),
      replies_(shards_) {}

SparseCalls::~SparseCalls() = default;

void SparseCalls::set_tables(std::vector<pb::EmbeddingTableSpec> tables) {
  absl::MutexLock lock(&member_mu_);
  tables_ = std::move(tables);
}

std::vector<pb::EmbeddingTableSpec> SparseCalls::tables() const {
  absl::MutexLock lock(&member_mu_);
  return tables_;
}

absl::StatusOr<int> SparseCalls::TableDim(uint32_t table) const {
  absl::MutexLock lock(&member_mu_);
  if (table >= tables_.size()) return UndeclaredTable(table, tables_.size());
  const pb::EmbeddingTableSpec& spec = tables_[table];
  if (spec.dim() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table ", table, " ('", spec.name(), "') has dim ", spec.dim(), "; it must be positive"));
  }
  return spec.dim();
}

void SparseCalls::SetMember(Member member) {
  absl::MutexLock lock(&member_mu_);
  member_ = std::move(member);
  ++member_changes_;
}

std::string SparseCalls::CallName(DataMethod method, uint32_t table, int shard) const {
  std::string name;
  {
    absl::MutexLock lock(&member_mu_);
    if (table < tables_.size()) name = tables_[table].name();
  }
  return absl::StrCat(DataMethodName(method), " of table ", table, name.empty() ? "" : absl::StrCat(" ('", name, "')"),
                      shards_ > 1 ? absl::StrCat(" on shard ", shard) : "");
}

absl::Status SparseCalls::Prepare(const char* method, uint32_t table, size_t ids) {
  uint64_t changes = 0;
  {
    absl::MutexLock lock(&member_mu_);
    if (member_.rank < 0) return absl::FailedPreconditionError(absl::StrCat(method, " before Join"));
    if (table >= tables_.size()) return UndeclaredTable(table, tables_.size());
    call_member_ = member_;
    changes = member_changes_;
  }
  SUMMA_ASSIGN_OR_RETURN(dim_, TableDim(table));
  if (call_member_.sessions.size() != static_cast<size_t>(shards_)) {
    return absl::InternalError(absl::StrCat("the client holds ", call_member_.sessions.size(), " sessions for ",
                                            shards_, " shards"));
  }
  if (ids > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(method, " of ", ids, " ids: at most ", UINT32_MAX, " at once"));
  }
  // After a Join the plane may be elsewhere (a restarted server): the transport is made anew.
  if (changes != member_seen_) {
    transport_.reset();
    member_seen_ = changes;
  }
  SUMMA_RETURN_IF_ERROR(source_(&transport_));
  if (transport_ == nullptr) return absl::InternalError("the sparse calls were given no transport");
  return absl::OkStatus();
}

absl::Status SparseCalls::Run(DataMethod method, uint32_t table,
                              const std::function<bool(int, const absl::Status&)>& done) {
  const absl::Time deadline = absl::Now() + call_member_.deadline;
  size_t started = 0;
  for (int s = 0; s < shards_; ++s) {
    if (!called_[s]) continue;
    outcome_[s] = absl::OkStatus();
    transport_->Start(static_cast<size_t>(s), s, method, &requests_[s], &replies_[s], deadline);
    ++started;
  }
  absl::Status first_error;
  for (size_t ended = 0; ended < started;) {
    size_t tag;
    absl::Status status;
    // Every call has a deadline, so every call comes back.
    if (!transport_->Next(&tag, &status)) {
      first_error = absl::InternalError("the client lost track of its sparse calls in flight");
      break;
    }
    if (tag == DataTransport::kWoken) continue;
    ++ended;
    const int s = static_cast<int>(tag);
    outcome_[s] = status;
    if (!status.ok() && !(done != nullptr && done(s, status)) && first_error.ok()) {
      first_error = Prefixed(CallName(method, table, s), status);
    }
  }
  // A plane that could not be reached (its server restarted elsewhere): asked for again.
  if (transport_->lost()) transport_.reset();
  return first_error;
}

absl::StatusOr<uint64_t> SparseCalls::Pull(uint32_t table, uint64_t min_version, absl::Span<const uint64_t> ids,
                                           float* rows) {
  absl::MutexLock lock(&mu_);
  SUMMA_RETURN_IF_ERROR(Prepare("SparsePull", table, ids.size()));
  // No ids: a wait for min_version on every shard (a step that used no row waits so before its
  // empty push, which a shard still a step behind would refuse as a future step's).
  const bool wait_only = ids.empty();
  batch_.Plan(ids, shards_);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  // A batch that is its own distinct ids goes straight from the caller's ids, and its rows
  // straight into the caller's.
  const bool direct = batch_.identity();
  const uint64_t* distinct_ids = direct ? ids.data() : batch_.ids().data();
  float* distinct_rows =
      direct ? rows : reinterpret_cast<float*>(distinct_rows_.Resize(batch_.distinct() * row_bytes));
  for (int s = 0; s < shards_; ++s) {
    const size_t count = batch_.count(s);
    called_[s] = count > 0 || wait_only;
    if (!called_[s]) continue;
    if (count * row_bytes > kMaxCallBytes) {
      return absl::InvalidArgumentError(absl::StrCat(CallName(DataMethod::kSparsePull, table, s), ": ", count,
                                                     " distinct rows of ", dim_, " floats are ", count * row_bytes,
                                                     " bytes, over the ", kMaxCallBytes,
                                                     " a call carries: pull fewer ids at once"));
    }
    pull_.set_rank(call_member_.rank);
    pull_.set_session(call_member_.sessions[s]);
    pull_.set_table(table);
    pull_.set_min_version(min_version);
    requests_[s] = wait_only ? Encode(pull_)
                             : EncodeWithBytes(pull_, pb::SparsePullRequest::kIdsFieldNumber,
                                               BorrowedSlice(distinct_ids + batch_.begin(s), count * sizeof(uint64_t)));
  }
  SUMMA_RETURN_IF_ERROR(Run(DataMethod::kSparsePull, table, nullptr));
  uint64_t version = UINT64_MAX;
  constexpr int kRowsPath[] = {pb::SparsePullResponse::kRowsFieldNumber};
  for (int s = 0; s < shards_; ++s) {
    if (!called_[s]) continue;
    const size_t bytes = batch_.count(s) * row_bytes;
    char* into = reinterpret_cast<char*>(distinct_rows + batch_.begin(s) * dim_);
    bool got = false;
    const absl::Status parsed = ParseWithBytes(
        replies_[s], kRowsPath,
        [&](uint64_t length) -> absl::StatusOr<char*> {
          if (length != bytes) return absl::DataLossError(absl::StrCat(length, " bytes of rows, expected ", bytes));
          got = true;
          return into;
        },
        &pulled_);
    replies_[s].Clear();
    if (parsed.ok() && !got && bytes > 0) {
      return absl::DataLossError(absl::StrCat(CallName(DataMethod::kSparsePull, table, s), ": the reply holds no rows"));
    }
    if (parsed.ok() && pulled_.table() != table) {
      return absl::DataLossError(
          absl::StrCat(CallName(DataMethod::kSparsePull, table, s), ": the reply is table ", pulled_.table(), "'s"));
    }
    if (!parsed.ok()) return Prefixed(CallName(DataMethod::kSparsePull, table, s), parsed);
    version = std::min(version, pulled_.version());
  }
  if (!direct) batch_.Scatter(distinct_rows, dim_, rows);
  return version;
}

absl::StatusOr<bool> SparseCalls::Push(uint32_t table, uint64_t step, int64_t num_examples,
                                       absl::Span<const uint64_t> ids, const float* grads) {
  absl::MutexLock lock(&mu_);
  SUMMA_RETURN_IF_ERROR(Prepare("SparsePush", table, ids.size()));
  batch_.Plan(ids, shards_);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  // Sync mode: every member's push (empty or not) makes the table's step on every shard.
  const bool every_shard = call_member_.mode == pb::MODE_SYNC;
  const bool direct = batch_.identity();
  const uint64_t* distinct_ids = direct ? ids.data() : batch_.ids().data();
  const float* distinct_grads = grads;
  if (!direct) {
    float* summed = reinterpret_cast<float*>(distinct_rows_.Resize(batch_.distinct() * row_bytes));
    batch_.Sum(grads, dim_, summed);
    distinct_grads = summed;
  }
  for (int s = 0; s < shards_; ++s) {
    const size_t count = batch_.count(s);
    called_[s] = count > 0 || every_shard;
    if (!called_[s]) continue;
    if (count * (sizeof(uint64_t) + row_bytes) > kMaxCallBytes) {
      return absl::InvalidArgumentError(absl::StrCat(CallName(DataMethod::kSparsePush, table, s), ": ", count,
                                                     " distinct rows of ", dim_, " floats are ",
                                                     count * (sizeof(uint64_t) + row_bytes), " bytes, over the ",
                                                     kMaxCallBytes, " a call carries: push fewer ids at once"));
    }
    push_.set_rank(call_member_.rank);
    push_.set_session(call_member_.sessions[s]);
    push_.set_table(table);
    push_.set_step(step);
    push_.set_num_examples(num_examples);
    push_.set_count(static_cast<uint32_t>(count));
    if (count == 0) {
      requests_[s] = Encode(push_);
      continue;
    }
    const size_t begin = batch_.begin(s);
    requests_[s] = EncodeWithBytes(push_, pb::SparsePushRequest::kDataFieldNumber,
                                   BorrowedSlice(distinct_ids + begin, count * sizeof(uint64_t)),
                                   BorrowedSlice(distinct_grads + begin * dim_, count * row_bytes));
  }
  // A push the shard had counted already (sent again after a failure elsewhere) is done.
  SUMMA_RETURN_IF_ERROR(
      Run(DataMethod::kSparsePush, table, [](int, const absl::Status& s) { return absl::IsAlreadyExists(s); }));
  bool completed = true;
  for (int s = 0; s < shards_; ++s) {
    if (!called_[s]) continue;
    if (!outcome_[s].ok()) {  // counted before: whether it completed the step is not known here
      completed = false;
      continue;
    }
    const absl::Status parsed = ParseWithBytes(replies_[s], {}, nullptr, &pushed_);
    replies_[s].Clear();
    if (!parsed.ok()) return Prefixed(CallName(DataMethod::kSparsePush, table, s), parsed);
    completed = completed && pushed_.completed_step();
  }
  return completed;
}

}  // namespace summa::worker
