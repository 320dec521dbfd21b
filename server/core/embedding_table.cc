#include "server/core/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/row_hash.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

constexpr int kMaxDim = 65536;
// What an id waiting for admission takes: its entry in the map, about.
constexpr int64_t kWaitingBytes = 16;
// What a row's entry in the index takes besides the row: key, slot and the map's control byte,
// with the map's spare capacity, about.
constexpr int64_t kIndexBytes = 24;

// Uniform in [0, 1) from 24 bits of `h`: exact in a float.
double Unit(uint64_t h) { return static_cast<double>(h >> 40) * (1.0 / 16777216.0); }

}  // namespace

bool TableMemory::TryTake(int64_t bytes) {
  const int64_t now = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (limit_ > 0 && now > limit_) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void TableRows::Clear() {
  ids.clear();
  values.clear();
  for (auto& s : slots) s.clear();
  touched.clear();
}

absl::StatusOr<pb::EmbeddingTableSpec> EmbeddingTable::Normalized(pb::EmbeddingTableSpec spec) {
  const std::string what = absl::StrCat("embedding table '", spec.name(), "'");
  if (spec.name().empty()) return absl::InvalidArgumentError("an embedding table needs a name");
  if (spec.dim() < 1 || spec.dim() > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dim ", spec.dim(), " must be in [1, ", kMaxDim, "]"));
  }
  if (spec.dtype() == pb::DTYPE_UNSPECIFIED) spec.set_dtype(pb::DTYPE_FLOAT32);
  if (spec.dtype() != pb::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a table keeps DTYPE_FLOAT32 rows, not ",
                                                   pb::DType_Name(spec.dtype())));
  }
  pb::RowInitializer& init = *spec.mutable_initializer();
  if (init.kind().empty()) init.set_kind("zeros");
  if (init.kind() != "zeros" && init.kind() != "uniform" && init.kind() != "normal") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown initializer '", init.kind(), "': use zeros, uniform or normal"));
  }
  if (!std::isfinite(init.a()) || !std::isfinite(init.b()) || (init.kind() == "uniform" && init.b() < init.a()) ||
      (init.kind() == "normal" && init.b() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": initializer ", init.kind(), "(", init.a(), ", ", init.b(),
                                                   ") needs finite bounds a <= b (normal: a standard deviation >= 0)"));
  }
  pb::RowOptimizer& opt = *spec.mutable_optimizer();
  if (opt.name().empty()) opt.set_name("sgd");
  if (opt.name() != "sgd" && opt.name() != "adagrad" && opt.name() != "adam") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown row optimizer '", opt.name(), "': use sgd, adagrad or adam"));
  }
  if (opt.learning_rate() == 0) opt.set_learning_rate(0.01);
  if (opt.eps() == 0) opt.set_eps(opt.name() == "adagrad" ? 1e-10 : 1e-8);
  if (opt.beta1() == 0 && opt.name() == "adam") opt.set_beta1(0.9);
  if (opt.beta2() == 0 && opt.name() == "adam") opt.set_beta2(0.999);
  if (!std::isfinite(opt.initial_accumulator_value()) || opt.initial_accumulator_value() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": initial_accumulator_value ",
                                                   opt.initial_accumulator_value(), " must be finite and >= 0"));
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(const pb::EmbeddingTableSpec& given,
                                                                       TableContext context) {
  absl::StatusOr<pb::EmbeddingTableSpec> spec = Normalized(given);
  if (!spec.ok()) return spec.status();
  OptimizerOptions o;
  o.name = spec->optimizer().name();
  o.learning_rate = spec->optimizer().learning_rate();
  o.eps = spec->optimizer().eps();
  o.beta1 = spec->optimizer().beta1();
  o.beta2 = spec->optimizer().beta2();
  absl::StatusOr<std::unique_ptr<const Optimizer>> optimizer = Optimizer::Create(o);
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table '", spec->name(), "': ", optimizer.status().message()));
  }
  return std::unique_ptr<EmbeddingTable>(new EmbeddingTable(*std::move(spec), context, *std::move(optimizer)));
}

EmbeddingTable::EmbeddingTable(pb::EmbeddingTableSpec spec, TableContext context,
                               std::unique_ptr<const Optimizer> optimizer)
    : spec_(std::move(spec)),
      ctx_(context),
      optimizer_(std::move(optimizer)),
      slot_names_(optimizer_->SlotNames()),
      dim_(spec_.dim()),
      stride_(static_cast<int64_t>(spec_.dim()) * (1 + static_cast<int64_t>(slot_names_.size()))),
      row_bytes_(stride_ * static_cast<int64_t>(sizeof(float)) + 2 * sizeof(uint64_t) + kIndexBytes),
      chunk_rows_(std::max<int64_t>(1, kHugePage / (stride_ * static_cast<int64_t>(sizeof(float))))),
      next_step_(ctx_.members->world_size(), 0),
      pushed_(ctx_.members->world_size(), false) {}

EmbeddingTable::~EmbeddingTable() {
  absl::MutexLock lock(&mu_);
  ctx_.memory->Give(static_cast<int64_t>(index_.size()) * row_bytes_ +
                    static_cast<int64_t>(waiting_.size()) * kWaitingBytes);
}

void EmbeddingTable::FreeChunk::operator()(float* p) const { std::free(p); }

float* EmbeddingTable::Values(uint32_t slot) { return chunks_[slot / chunk_rows_].get() + (slot % chunk_rows_) * stride_; }
const float* EmbeddingTable::Values(uint32_t slot) const {
  return chunks_[slot / chunk_rows_].get() + (slot % chunk_rows_) * stride_;
}
float* EmbeddingTable::Slot(uint32_t slot, int k) { return Values(slot) + static_cast<int64_t>(k + 1) * dim_; }
const float* EmbeddingTable::Slot(uint32_t slot, int k) const { return Values(slot) + static_cast<int64_t>(k + 1) * dim_; }

void EmbeddingTable::Initialize(uint64_t id, float* values) const {
  const pb::RowInitializer& init = spec_.initializer();
  if (init.kind() == "zeros") {
    std::fill(values, values + dim_, 0.0f);
    return;
  }
  const uint64_t row = MixRowId(id ^ MixRowId(init.seed()));
  for (int j = 0; j < dim_; ++j) {
    const uint64_t h = MixRowId(row + static_cast<uint64_t>(j));
    if (init.kind() == "uniform") {
      values[j] = static_cast<float>(init.a() + (init.b() - init.a()) * Unit(h));
    } else {
      // Box-Muller on two 24-bit uniforms of one hash; u1 in (0, 1].
      const double u1 = 1.0 - Unit(h);
      const double u2 = Unit(h << 24);
      values[j] = static_cast<float>(init.a() + init.b() * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
    }
  }
}

absl::Status EmbeddingTable::CheckIds(absl::Span<const uint64_t> ids) const {
  const uint64_t limit = spec_.num_embeddings();
  for (uint64_t id : ids) {
    if (limit != 0 && id >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table '", name(), "': id ", id,
                                                     " is past its num_embeddings, ", limit));
    }
    if (RowShard(id, ctx_.shards) != ctx_.shard) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table '", name(), "': id ", id, " is shard ",
                                                     RowShard(id, ctx_.shards), "'s of ", ctx_.shards,
                                                     ", not this shard's (", ctx_.shard, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> EmbeddingTable::CreateRow(uint64_t id) {
  if (!ctx_.memory->TryTake(row_bytes_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "embedding table '", name(), "' cannot create row ", id, ": this shard's tables hold ", ctx_.memory->used(),
        " bytes of summa-server --max_table_bytes=", ctx_.memory->limit(), " (", index_.size(),
        " rows of this table); raise it, add shards, or drop rows with expire_after"));
  }
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slot_id_.size());
    if (slot % chunk_rows_ == 0) {
      const int64_t bytes = chunk_rows_ * stride_ * static_cast<int64_t>(sizeof(float));
      const size_t rounded = static_cast<size_t>((bytes + kHugePage - 1) / kHugePage * kHugePage);
      void* chunk = std::aligned_alloc(kHugePage, rounded);
      if (chunk == nullptr) {
        ctx_.memory->Give(row_bytes_);
        return absl::ResourceExhaustedError(
            absl::StrCat("embedding table '", name(), "' cannot create row ", id, ": out of memory"));
      }
      madvise(chunk, rounded, MADV_HUGEPAGE);  // advice: without transparent huge pages, 4 KiB pages
      chunks_.emplace_back(static_cast<float*>(chunk));
    }
    slot_id_.push_back(0);
    slot_touched_.push_back(0);
  }
  slot_id_[slot] = id;
  slot_touched_[slot] = version_;
  float* row = Values(slot);
  Initialize(id, row);
  const float accumulator =
      spec_.optimizer().name() == "adagrad" ? static_cast<float>(spec_.optimizer().initial_accumulator_value()) : 0.0f;
  std::fill(row + dim_, row + stride_, accumulator);
  index_.emplace(id, slot);
  ++rows_created_;
  return slot;
}

void EmbeddingTable::DropRow(uint64_t id, uint32_t slot) {
  index_.erase(id);
  slot_touched_[slot] = UINT64_MAX;  // free
  free_slots_.push_back(slot);
  ctx_.memory->Give(row_bytes_);
}

void EmbeddingTable::Lookup(absl::Span<const uint64_t> ids) {
  lookup_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto found = index_.find(ids[i]);
    lookup_[i] = found == index_.end() ? -1 : static_cast<int64_t>(found->second);
  }
}

void EmbeddingTable::PrefetchRow(int64_t slot) const {
  if (slot < 0) return;
  const char* row = reinterpret_cast<const char*>(Values(static_cast<uint32_t>(slot)));
  for (int64_t b = 0; b < stride_ * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(row + b);
}

// How many rows ahead of the one in use are prefetched: enough misses in flight to hide a
// miss's latency, few enough that the lines are still there when used.
constexpr size_t kPrefetchAhead = 8;

absl::Status EmbeddingTable::Answer(const std::vector<uint64_t>& ids, ParkedCall& call) {
  float* out;
  Snapshot answer = answers_.Acquire(static_cast<int64_t>(ids.size()) * dim_, &out);
  const uint64_t admit_after = spec_.admit_after();
  Lookup(ids);
  for (size_t i = 0; i < std::min(kPrefetchAhead, ids.size()); ++i) PrefetchRow(lookup_[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) PrefetchRow(lookup_[i + kPrefetchAhead]);
    const uint64_t id = ids[i];
    float* dst = out + i * dim_;
    // A row the lookup missed may have been created since, by this pull (an id twice).
    auto found = lookup_[i] >= 0 ? index_.end() : index_.find(id);
    uint32_t slot;
    if (lookup_[i] >= 0) {
      slot = static_cast<uint32_t>(lookup_[i]);
    } else if (found != index_.end()) {
      slot = found->second;
    } else {
      if (admit_after > 1) {
        auto waiting = waiting_.find(id);
        if (waiting == waiting_.end()) {
          if (!ctx_.memory->TryTake(kWaitingBytes)) {
            return absl::ResourceExhaustedError(absl::StrCat(
                "embedding table '", name(), "' cannot count id ", id, " for admission: this shard's tables hold ",
                ctx_.memory->used(), " bytes of summa-server --max_table_bytes=", ctx_.memory->limit()));
          }
          waiting = waiting_.emplace(id, 0).first;
        }
        if (++waiting->second < admit_after) {
          std::fill(dst, dst + dim_, 0.0f);
          ++unadmitted_reads_;
          continue;
        }
        waiting_.erase(waiting);
        ctx_.memory->Give(kWaitingBytes);
      }
      absl::StatusOr<uint32_t> created = CreateRow(id);
      if (!created.ok()) return created.status();
      slot = *created;
    }
    slot_touched_[slot] = version_;
    std::memcpy(dst, Values(slot), dim_ * sizeof(float));
  }
  rows_pulled_ += ids.size();
  call.Fill(version_, answer);
  return absl::OkStatus();
}

void EmbeddingTable::Pull(std::vector<uint64_t> ids, uint64_t min_version, absl::Time deadline,
                          std::shared_ptr<ParkedCall> call, CallsToFinish& out) {
  absl::MutexLock lock(&mu_);
  if (!retired_.ok()) {
    if (call->Claim()) out.Add(std::move(call), retired_);
    return;
  }
  if (version_ >= min_version) {
    if (!call->Claim()) return;
    absl::Status answered = Answer(ids, *call);
    out.Add(std::move(call), std::move(answered));
    return;
  }
  if (ctx_.mode == Mode::kSync && min_version > version_ + 1) {
    if (call->Claim()) {
      out.Add(std::move(call), absl::OutOfRangeError(absl::StrCat(
                                   "embedding table '", name(), "' is at version ", version_, "; a pull of version ",
                                   min_version, " would wait for a step no one can push yet")));
    }
    return;
  }
  parked_.push_back({std::move(call), std::move(ids), min_version, deadline});
}

void EmbeddingTable::ReleasePulls(CallsToFinish& out) {
  size_t kept = 0;
  for (size_t i = 0; i < parked_.size(); ++i) {
    ParkedPull& p = parked_[i];
    if (p.target > version_) {
      if (kept != i) parked_[kept] = std::move(p);
      ++kept;
      continue;
    }
    if (!p.call->Claim()) continue;
    absl::Status answered = Answer(p.ids, *p.call);
    out.Add(std::move(p.call), std::move(answered));
  }
  parked_.resize(kept);
}

void EmbeddingTable::Accumulate(absl::Span<const uint64_t> ids, absl::Span<const float> grads) {
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, added] = pending_.try_emplace(ids[i], static_cast<uint32_t>(pending_ids_.size()));
    const float* g = grads.data() + i * dim_;
    if (added) {
      pending_ids_.push_back(ids[i]);
      pending_values_.insert(pending_values_.end(), g, g + dim_);
      continue;
    }
    float* sum = pending_values_.data() + static_cast<int64_t>(it->second) * dim_;
    for (int j = 0; j < dim_; ++j) sum[j] += g[j];
  }
  rows_pushed_ += ids.size();
}

void EmbeddingTable::Complete(int64_t examples, bool skip, CallsToFinish& out) {
  if (skip || examples <= 0) {
    dropped_gradients_ += pending_ids_.size();  // nothing to apply them with
  } else if (!pending_ids_.empty()) {
    const uint64_t t = updates_;
    const double lr = optimizer_->LearningRate(t);
    std::vector<absl::Span<float>> slots(slot_names_.size());
    const size_t n = pending_ids_.size();
    Lookup(pending_ids_);
    for (size_t r = 0; r < std::min(kPrefetchAhead, n); ++r) PrefetchRow(lookup_[r]);
    for (size_t r = 0; r < n; ++r) {
      if (r + kPrefetchAhead < n) PrefetchRow(lookup_[r + kPrefetchAhead]);
      if (lookup_[r] < 0) {
        ++dropped_gradients_;  // not admitted yet, or expired since it was read
        continue;
      }
      const uint32_t slot = static_cast<uint32_t>(lookup_[r]);
      for (size_t k = 0; k < slots.size(); ++k) slots[k] = absl::MakeSpan(Slot(slot, static_cast<int>(k)), dim_);
      optimizer_->Apply(t, lr, absl::MakeSpan(Values(slot), dim_), slots,
                        absl::MakeConstSpan(pending_values_.data() + r * dim_, dim_), examples);
      slot_touched_[slot] = version_;
    }
  }
  if (examples > 0 && !skip) ++updates_;
  pending_skip_ = false;
  // Erased one by one, not cleared: clear() gives a large map's array back, and the next step
  // would grow it again, page by fresh page.
  for (uint64_t id : pending_ids_) pending_.erase(id);
  pending_ids_.clear();
  pending_values_.clear();
  pending_examples_ = 0;
  std::fill(pushed_.begin(), pushed_.end(), false);
  ++version_;
  const uint64_t expire_after = spec_.expire_after();
  if (expire_after > 0 && version_ % expire_after == 0) {
    for (uint32_t slot = 0; slot < slot_id_.size(); ++slot) {
      const uint64_t touched = slot_touched_[slot];
      // Touched at step `touched`, untouched through steps touched + 1 .. version_ - 1.
      if (touched == UINT64_MAX || version_ - 1 - touched < expire_after) continue;
      DropRow(slot_id_[slot], slot);
      ++rows_expired_;
    }
  }
  ReleasePulls(out);
}

bool EmbeddingTable::StepComplete() const {
  const GroupView group = ctx_.members->GroupAt(version_);
  if (group.ranks.empty()) return false;
  for (int rank : group.ranks) {
    if (rank >= static_cast<int>(pushed_.size()) || !pushed_[rank]) return false;
  }
  return true;
}

absl::StatusOr<bool> EmbeddingTable::Push(int rank, uint64_t step, int64_t num_examples,
                                          absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                          CallsToFinish& out, bool skip) {
  const std::string what = absl::StrCat("embedding table '", name(), "'");
  if (grads.size() != ids.size() * static_cast<size_t>(dim_)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has rows of ", dim_, " floats; the push sends ", ids.size(),
                                                   " ids and ", grads.size(), " gradient values"));
  }
  if (num_examples < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_examples ", num_examples, " is negative"));
  }
  if (rank < 0 || rank >= static_cast<int>(next_step_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", rank, " is outside the job's ", next_step_.size()));
  }
  absl::MutexLock lock(&mu_);
  if (!retired_.ok()) return retired_;
  if (ctx_.mode != Mode::kSync) {
    if (step < next_step_[rank]) {
      return absl::AlreadyExistsError(absl::StrCat(what, ": rank ", rank, " pushed step ", step, " already"));
    }
    Accumulate(ids, grads);
    next_step_[rank] = step + 1;
    Complete(num_examples, skip, out);
    return true;
  }
  if (step < version_ || (step == version_ && pushed_[rank])) {
    if (next_step_[rank] > step) {
      return absl::AlreadyExistsError(absl::StrCat(what, ": rank ", rank, " pushed step ", step, " already"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": step ", step, " has finished without rank ", rank, " (the table is at ", version_, ")"));
  }
  if (step > version_) {
    return absl::OutOfRangeError(absl::StrCat(what, ": step ", step, " is in the future; the table is at ", version_));
  }
  if (!ctx_.members->GroupAt(step).Contains(rank)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": rank ", rank, " is not in step ", step, "'s group"));
  }
  Accumulate(ids, grads);
  pending_examples_ += num_examples;
  pending_skip_ = pending_skip_ || skip;
  pushed_[rank] = true;
  next_step_[rank] = step + 1;
  if (!StepComplete()) return false;
  Complete(pending_examples_, pending_skip_, out);
  return true;
}

void EmbeddingTable::OnMembershipChange(CallsToFinish& out) {
  if (ctx_.mode != Mode::kSync) return;
  absl::MutexLock lock(&mu_);
  if (StepComplete()) Complete(pending_examples_, pending_skip_, out);
}

void EmbeddingTable::OnAdmitted(int rank, uint64_t from_step) {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(next_step_.size())) return;
  if (ctx_.mode == Mode::kSync) next_step_[rank] = std::max(next_step_[rank], from_step);
}

void EmbeddingTable::Expire(absl::Time now, CallsToFinish& out) {
  absl::MutexLock lock(&mu_);
  size_t kept = 0;
  for (size_t i = 0; i < parked_.size(); ++i) {
    ParkedPull& p = parked_[i];
    if (p.deadline > now) {
      if (kept != i) parked_[kept] = std::move(p);
      ++kept;
      continue;
    }
    if (!p.call->Claim()) continue;
    std::vector<int> missing;
    for (int rank : ctx_.members->GroupAt(version_).ranks) {
      if (rank < static_cast<int>(pushed_.size()) && !pushed_[rank]) missing.push_back(rank);
    }
    out.Add(std::move(p.call),
            absl::DeadlineExceededError(absl::StrCat("embedding table '", name(), "' is still at version ", version_,
                                                     ": step ", version_, " waits for the pushes of rank(s) ",
                                                     absl::StrJoin(missing, ", "))));
  }
  parked_.resize(kept);
}

void EmbeddingTable::Retire(const absl::Status& gone, CallsToFinish& out) {
  absl::MutexLock lock(&mu_);
  for (ParkedPull& p : parked_) {
    if (p.call->Claim()) out.Add(std::move(p.call), gone);
  }
  parked_.clear();
  ctx_.memory->Give(IndexBytes());
  retired_ = gone;
  index_ = {};
  waiting_ = {};
  pending_ = {};
  chunks_.clear();
  slot_id_ = {};
  slot_touched_ = {};
  free_slots_ = {};
  pending_ids_ = {};
  pending_values_ = {};
  pending_skip_ = false;
}

void EmbeddingTable::FailParked(const absl::Status& status, CallsToFinish& out) {
  absl::MutexLock lock(&mu_);
  for (ParkedPull& p : parked_) {
    if (p.call->Claim()) out.Add(std::move(p.call), status);
  }
  parked_.clear();
}

uint64_t EmbeddingTable::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

uint64_t EmbeddingTable::NextStep(int rank) const {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(next_step_.size())) return 0;
  return ctx_.mode == Mode::kSync ? std::max(version_, next_step_[rank]) : next_step_[rank];
}

int64_t EmbeddingTable::IndexBytes() const {
  return static_cast<int64_t>(index_.size()) * row_bytes_ + static_cast<int64_t>(waiting_.size()) * kWaitingBytes;
}

TableCounters EmbeddingTable::Counters() const {
  absl::MutexLock lock(&mu_);
  TableCounters c;
  c.name = name();
  c.dim = dim_;
  c.optimizer = spec_.optimizer().name();
  c.version = version_;
  c.rows = static_cast<int64_t>(index_.size());
  c.bytes = IndexBytes();
  c.rows_created = rows_created_;
  c.rows_expired = rows_expired_;
  c.rows_waiting_admission = static_cast<int64_t>(waiting_.size());
  c.unadmitted_reads = unadmitted_reads_;
  c.dropped_gradients = dropped_gradients_;
  c.rows_pulled = rows_pulled_;
  c.rows_pushed = rows_pushed_;
  return c;
}

absl::Status EmbeddingTable::Save(TableState* state, int64_t chunk_rows,
                                  absl::FunctionRef<absl::Status(const TableRows&)> chunk) const {
  absl::MutexLock lock(&mu_);
  state->version = version_;
  state->updates = updates_;
  state->rows_created = rows_created_;
  state->rows_expired = rows_expired_;
  state->dropped_gradients = dropped_gradients_;
  state->rows = index_.size();
  state->next_steps = next_step_;
  state->waiting_ids.clear();
  state->waiting_counts.clear();
  for (const auto& [id, count] : waiting_) {
    state->waiting_ids.push_back(id);
    state->waiting_counts.push_back(count);
  }
  TableRows rows;
  rows.slots.resize(slot_names_.size());
  auto flush = [&]() -> absl::Status {
    if (rows.ids.empty()) return absl::OkStatus();
    absl::Status s = chunk(rows);
    rows.Clear();
    return s;
  };
  for (uint32_t slot = 0; slot < slot_id_.size(); ++slot) {
    if (slot_touched_[slot] == UINT64_MAX) continue;
    rows.ids.push_back(slot_id_[slot]);
    rows.touched.push_back(slot_touched_[slot]);
    const float* v = Values(slot);
    rows.values.insert(rows.values.end(), v, v + dim_);
    for (size_t k = 0; k < slot_names_.size(); ++k) {
      const float* s = Slot(slot, static_cast<int>(k));
      rows.slots[k].insert(rows.slots[k].end(), s, s + dim_);
    }
    if (static_cast<int64_t>(rows.ids.size()) >= chunk_rows) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
  }
  return flush();
}

void EmbeddingTable::RestoreState(const TableState& state) {
  absl::MutexLock lock(&mu_);
  version_ = state.version;
  updates_ = state.updates;
  rows_created_ = state.rows_created;
  rows_expired_ = state.rows_expired;
  dropped_gradients_ = state.dropped_gradients;
  for (size_t r = 0; r < next_step_.size() && r < state.next_steps.size(); ++r) next_step_[r] = state.next_steps[r];
  for (size_t i = 0; i < state.waiting_ids.size() && i < state.waiting_counts.size(); ++i) {
    const uint64_t id = state.waiting_ids[i];
    if (RowShard(id, ctx_.shards) != ctx_.shard) continue;
    if (waiting_.contains(id) || !ctx_.memory->TryTake(kWaitingBytes)) continue;
    waiting_.emplace(id, state.waiting_counts[i]);
  }
}

absl::Status EmbeddingTable::RestoreRows(const TableRows& rows) {
  const size_t n = rows.ids.size();
  if (rows.values.size() != n * dim_ || rows.touched.size() != n || rows.slots.size() != slot_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", name(), "': a checkpoint's chunk of ", n,
                                                   " rows does not hold rows of ", dim_, " floats with ",
                                                   slot_names_.size(), " optimizer slot(s)"));
  }
  for (const auto& s : rows.slots) {
    if (s.size() != n * dim_) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding table '", name(), "': a checkpoint's optimizer slot is not ", n, " rows long"));
    }
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = rows.ids[i];
    if (RowShard(id, ctx_.shards) != ctx_.shard) continue;
    uint32_t slot;
    if (auto found = index_.find(id); found != index_.end()) {
      slot = found->second;
    } else {
      absl::StatusOr<uint32_t> created = CreateRow(id);
      if (!created.ok()) return created.status();
      slot = *created;
      --rows_created_;  // restored, not created: the state's count stands
    }
    std::memcpy(Values(slot), rows.values.data() + i * dim_, dim_ * sizeof(float));
    for (size_t k = 0; k < slot_names_.size(); ++k) {
      std::memcpy(Slot(slot, static_cast<int>(k)), rows.slots[k].data() + i * dim_, dim_ * sizeof(float));
    }
    slot_touched_[slot] = rows.touched[i];
  }
  return absl::OkStatus();
}

std::vector<float> EmbeddingTable::RowForTest(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto found = index_.find(id);
  if (found == index_.end()) return {};
  const float* v = Values(found->second);
  return std::vector<float>(v, v + dim_);
}

std::vector<float> EmbeddingTable::SlotForTest(uint64_t id, int k) const {
  absl::MutexLock lock(&mu_);
  auto found = index_.find(id);
  if (found == index_.end() || k < 0 || k >= static_cast<int>(slot_names_.size())) return {};
  const float* v = Slot(found->second, k);
  return std::vector<float>(v, v + dim_);
}

}  // namespace summa::server
