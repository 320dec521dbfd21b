// ReplyTurns: the order in which the data planes' connection threads write the replies meant
// for one worker (server/rpc/socket_plane.h): one at a time, and of those waiting, the
// earliest partition first. Partitions follow the flat parameter buffer, which is the model's
// parameters in the order they were made, the order the next forward needs them: a reply of
// partition 0 that is ready goes before a reply of partition 9 that was ready first and still
// waits (ByteScheduler's rule, at the server's end). A worker's replies then arrive whole one
// after another, the earliest first, instead of all sharing its link and arriving together.
// Thread-safe.
#ifndef SUMMA_SERVER_RPC_REPLY_TURNS_H_
#define SUMMA_SERVER_RPC_REPLY_TURNS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace summa::server {

class ReplyTurns {
 public:
  // A worker's turn to be written to; its destructor hands the turn on. Move-only.
  class Turn {
   public:
    Turn() = default;
    Turn(Turn&& other) noexcept : turns_(std::exchange(other.turns_, nullptr)), worker_(std::move(other.worker_)) {}
    Turn& operator=(Turn&& other) noexcept;
    ~Turn() { Release(); }

   private:
    friend class ReplyTurns;
    Turn(ReplyTurns* turns, std::string worker) : turns_(turns), worker_(std::move(worker)) {}
    void Release();
    ReplyTurns* turns_ = nullptr;
    std::string worker_;
  };

  // Waits until no other reply to `worker` (its rank and session) is being written and none of an
  // earlier partition (then none that came earlier of the same) waits; its turn then. Waits at
  // most kLongestWait: a reply stalled ahead (a worker that stopped reading) keeps the worker's
  // others out of order then, not waiting for its write's own deadline. The turn returned after
  // such a wait is empty (it orders nothing).
  Turn Take(const std::string& worker, int64_t partition);
  static constexpr absl::Duration kLongestWait = absl::Seconds(2);

  // Replies waiting for their turn, over every worker.
  int64_t waiting() const;

 private:
  struct Queue {
    bool writing = false;
    std::set<std::pair<int64_t, uint64_t>> waiting;  // (partition, arrival)
  };
  void Release(const std::string& worker);

  mutable absl::Mutex mu_;
  absl::CondVar turned_;
  // Node-based: a waiting thread keeps a reference across others' insertions.
  absl::node_hash_map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_REPLY_TURNS_H_
