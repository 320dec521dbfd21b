#include "server/core/limits.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/partition_map.h"
#include "common/status_reason.h"

namespace summa::server {
namespace {

// What a data-path message carries beside its values (rank, session, step, shape...): far less.
constexpr int64_t kEnvelopeBytes = 64 << 10;

absl::Status AtLeastOne(int64_t value, absl::string_view flag) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be at least 1, got ", value));
}

}  // namespace

absl::Status ValidateLimits(const LimitOptions& l, int64_t partition_bytes) {
  const std::pair<int64_t, absl::string_view> counts[] = {
      {l.max_message_bytes, "max_message_bytes"},
      {l.max_model_bytes, "max_model_bytes"},
      {l.max_parked_calls, "max_parked_calls"},
      {l.max_parked_calls_per_peer, "max_parked_calls_per_peer"},
      {l.max_collectives, "max_collectives"},
      {l.max_open_collectives_per_peer, "max_open_collectives_per_peer"},
      {l.max_allreduce_bytes, "max_allreduce_bytes"},
      {l.max_bytes_in_flight_per_peer, "max_bytes_in_flight_per_peer"},
      {l.max_data_plane_connections, "max_data_plane_connections"},
      {l.max_data_plane_connections_in_hello, "max_data_plane_connections_in_hello"},
      {l.max_data_plane_connections_in_hello_per_source, "max_data_plane_connections_in_hello_per_source"},
  };
  for (const auto& [value, flag] : counts) {
    if (absl::Status s = AtLeastOne(value, flag); !s.ok()) return s;
  }
  const int64_t needed = std::max(partition_bytes, kAllReduceChunkBytes) + kEnvelopeBytes;
  if (l.max_message_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", l.max_message_bytes, " cannot carry a partition of ", partition_bytes,
        " bytes or an AllReduce chunk of ", kAllReduceChunkBytes, " bytes with its envelope: give it ",
        needed, " or more"));
  }
  if (l.max_message_bytes > (int64_t{2} << 30) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes must be below 2 GiB (gRPC's "
                                                   "limit), got ", l.max_message_bytes));
  }
  if (l.data_plane_hello_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--data_plane_hello_timeout must be positive, got ",
                                                   absl::FormatDuration(l.data_plane_hello_timeout)));
  }
  if (!(l.join_rate > 0) || !std::isfinite(l.join_rate)) {
    return absl::InvalidArgumentError(absl::StrCat("--join_rate must be a positive number of joins per "
                                                   "second, got ", l.join_rate));
  }
  return absl::OkStatus();
}

std::string PeerKey(int member_rank, absl::string_view grpc_peer) {
  if (member_rank >= 0) return absl::StrCat("rank ", member_rank);
  // "ipv4:1.2.3.4:5678", "ipv6:[::1]:5678": the port is after the last colon.
  const size_t colon = grpc_peer.rfind(':');
  const size_t scheme = grpc_peer.find(':');
  if (colon == absl::string_view::npos || colon == scheme) return std::string(grpc_peer);
  return std::string(grpc_peer.substr(0, colon));
}

// The peers are spread over stripes, each with a lock of its own, and the total is an atomic: a
// push takes no lock that every other push takes too (one process-wide mutex before).
struct PeerBudget::Hold::State {
  static constexpr size_t kStripes = 16;
  struct Stripe {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, int64_t> held ABSL_GUARDED_BY(mu);
  };
  Stripe& StripeOf(absl::string_view peer) { return stripes[absl::HashOf(peer) % kStripes]; }
  const Stripe& StripeOf(absl::string_view peer) const { return stripes[absl::HashOf(peer) % kStripes]; }

  std::string what;
  int64_t total_limit;
  std::string total_flag;
  int64_t peer_limit;
  std::string peer_flag;
  std::atomic<int64_t> total{0};
  Stripe stripes[kStripes];
};

PeerBudget::PeerBudget(std::string what, int64_t total_limit, std::string total_flag, int64_t peer_limit,
                       std::string peer_flag)
    : state_(std::make_shared<Hold::State>()) {
  state_->what = std::move(what);
  state_->total_limit = total_limit;
  state_->total_flag = std::move(total_flag);
  state_->peer_limit = peer_limit;
  state_->peer_flag = std::move(peer_flag);
}

absl::StatusOr<PeerBudget::Hold> PeerBudget::Take(absl::string_view peer, int64_t amount) {
  Hold::State& s = *state_;
  Hold::State::Stripe& stripe = s.StripeOf(peer);
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.held.find(peer);
  const int64_t mine = it == stripe.held.end() ? 0 : it->second;
  if (mine + amount > s.peer_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        peer, " holds ", mine, " ", s.what, " and asks for ", amount, " more: over the limit of ",
        s.peer_limit, " per peer (summa-server --", s.peer_flag, ")"));
  }
  // Taken first and given back when over: two takes at once that each fit alone but not together
  // are both refused at worst, never both admitted.
  const int64_t before = s.total.fetch_add(amount, std::memory_order_relaxed);
  if (!s.total_flag.empty() && before + amount > s.total_limit) {
    s.total.fetch_sub(amount, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server holds ", before, " ", s.what, "; ", peer, " asks for ", amount,
        " more: over the limit of ", s.total_limit, " in total (summa-server --", s.total_flag, ")"));
  }
  if (it == stripe.held.end()) {
    stripe.held.emplace(peer, amount);
  } else {
    it->second += amount;
  }
  return Hold(state_, std::string(peer), amount);
}

int64_t PeerBudget::total() const { return state_->total.load(std::memory_order_relaxed); }

int64_t PeerBudget::held_by(absl::string_view peer) const {
  const Hold::State::Stripe& stripe = state_->StripeOf(peer);
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.held.find(peer);
  return it == stripe.held.end() ? 0 : it->second;
}

PeerBudget::Hold& PeerBudget::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    peer_ = std::move(other.peer_);
    amount_ = std::exchange(other.amount_, 0);
  }
  return *this;
}

void PeerBudget::Hold::Release() {
  if (state_ == nullptr) return;
  {
    Hold::State::Stripe& stripe = state_->StripeOf(peer_);
    absl::MutexLock lock(&stripe.mu);
    auto it = stripe.held.find(peer_);
    if (it != stripe.held.end() && (it->second -= amount_) <= 0) stripe.held.erase(it);
  }
  state_->total.fetch_sub(amount_, std::memory_order_relaxed);
  state_ = nullptr;
  amount_ = 0;
}

JoinRate::JoinRate(double per_second, int world_size, const Clock* clock)
    : per_second_(per_second),
      burst_(std::max(per_second, 2.0 * world_size)),
      clock_(clock),
      tokens_(burst_),
      last_(clock->Now()) {}

absl::Status JoinRate::Take() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * per_second_);
  last_ = now;
  if (tokens_ < 1) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          "too many joins: over ", per_second_, " per second after a burst of ", burst_,
                          " (summa-server --join_rate); retry in ",
                          absl::FormatDuration(absl::Seconds((1 - tokens_) / per_second_)))),
                      StatusReason::kJoinRate);
  }
  tokens_ -= 1;
  return absl::OkStatus();
}

}  // namespace summa::server
