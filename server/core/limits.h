// Limits: what the server holds for its callers, bounded per peer and in total, so that a flood
// of bad or abandoned calls is refused with RESOURCE_EXHAUSTED (naming the limit and its flag)
// instead of growing the server's memory until it dies, while well-behaved members keep their
// own share.
//
// A peer is a member rank ("rank 3") for the calls of a joined member, and the client's address
// without its port otherwise (a fixed-group AllReduce, an observer's pull). A rank is what the
// call claims; a call whose session is not the rank's is refused by the core at once, so a
// claim holds a share only for that instant.
//
// PeerBudget counts an amount (calls, bytes, rounds) per peer and in total; a share is a Hold
// that gives its amount back when destroyed, on any thread; peers are spread over locks of their
// own, so calls of different peers do not wait for each other. JoinRate is a token bucket.
// Both are thread-safe.
#ifndef SUMMA_SERVER_CORE_LIMITS_H_
#define SUMMA_SERVER_CORE_LIMITS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/message_size.h"

namespace summa::server {

// Every limit is a flag of summa-server's, named in the status a refusal carries.
struct LimitOptions {
  // gRPC refuses a larger message in its transport (its status names no flag; the clients add it).
  int64_t max_message_bytes = kMaxMessageBytes;
  // The biggest model a Join may declare: the server allocates it (twice, with the optimizer's
  // state) before any value arrives.
  int64_t max_model_bytes = int64_t{16} << 30;
  // The bytes a shard's embedding tables hold (rows, their optimizer state, their index, ids
  // waiting for admission); 0: no bound. A pull that would create a row past it is refused.
  int64_t max_table_bytes = 0;
  // Pulls and AllReduce calls waiting for their step or round.
  int64_t max_parked_calls = 65536;
  int64_t max_parked_calls_per_peer = 4096;
  // AllReduce collectives the hub keeps (idle ones are forgotten, least recently used first, to
  // make room) and the rounds in progress one peer may have opened.
  int64_t max_collectives = 4096;
  int64_t max_open_collectives_per_peer = 1024;
  // The bytes of the AllReduce hub's buffers (sums in progress and the buffers kept for reuse).
  int64_t max_allreduce_bytes = int64_t{4} << 30;
  // The bytes of a peer's requests the server holds: AllReduce contributions until their round
  // completes, pushed and initial values while they are applied.
  int64_t max_bytes_in_flight_per_peer = int64_t{2} << 30;
  // Joins per second, with a burst of max(rate, 2 x workers) (a whole job restarting at once).
  double join_rate = 50;
  // The socket data plane's connections (server/rpc/socket_plane.h), each of which holds a
  // thread: in all (one past it is refused; only connections past their hello, that is with a
  // token, can fill it), and those still in their hello, in all and per source address. A
  // connection past either of the last two closes an older one still in its hello instead of
  // being refused, so that a flood without a token churns its own connections rather than shutting
  // members out.
  int64_t max_data_plane_connections = 4096;
  int64_t max_data_plane_connections_in_hello = 64;
  int64_t max_data_plane_connections_in_hello_per_source = 16;
  // How long a data-plane connection has, from its accept, to send its hello. A client on
  // loopback is answered within 0.2 ms (99th percentile, connect included); the rest is room for
  // a slow link and for a handshake inside the hello.
  absl::Duration data_plane_hello_timeout = absl::Seconds(2);
};

// INVALID_ARGUMENT naming the flag: a limit below 1, or a message limit too small to carry a
// partition of `partition_bytes` or an AllReduce chunk.
absl::Status ValidateLimits(const LimitOptions& limits, int64_t partition_bytes);

// The peer a call counts against: "rank N" for a member's call (rank >= 0), else the gRPC peer
// string without its port ("ipv4:10.0.0.7").
std::string PeerKey(int member_rank, absl::string_view grpc_peer);

class PeerBudget {
 public:
  // `what` names the amount in refusals ("parked calls"); the flags are the limits' names.
  PeerBudget(std::string what, int64_t total_limit, std::string total_flag, int64_t peer_limit,
             std::string peer_flag);

  // A share of the budget; gives its amount back when destroyed. Move-only; empty when
  // default-constructed or moved from.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept = default;
    Hold& operator=(Hold&& other) noexcept;
    ~Hold() { Release(); }
    void Release();

   private:
    friend class PeerBudget;
    struct State;
    Hold(std::shared_ptr<State> state, std::string peer, int64_t amount)
        : state_(std::move(state)), peer_(std::move(peer)), amount_(amount) {}
    std::shared_ptr<State> state_;
    std::string peer_;
    int64_t amount_ = 0;
  };

  // `amount` more for `peer`, or RESOURCE_EXHAUSTED naming the limit it would pass, and its flag.
  absl::StatusOr<Hold> Take(absl::string_view peer, int64_t amount);

  int64_t total() const;
  int64_t held_by(absl::string_view peer) const;

 private:
  std::shared_ptr<Hold::State> state_;
};

class JoinRate {
 public:
  JoinRate(double per_second, int world_size, const Clock* clock);
  // OK and one token taken, or RESOURCE_EXHAUSTED naming --join_rate (reason JOIN_RATE).
  absl::Status Take();
  // Joins refused so far.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  const double per_second_;
  const double burst_;
  const Clock* const clock_;  // Not owned.
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> refused_{0};
  absl::Time last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_LIMITS_H_
