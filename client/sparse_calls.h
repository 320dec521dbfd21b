// SparseCalls: the rows of the job's embedding tables (JoinRequest.tables), pulled and pushed by
// id (summa.v1 SparsePull and SparsePush) for ParameterClient. A batch's ids are deduplicated
// before they leave (RowBatch, client/row_batch.h): each distinct id goes once, to the shard that
// holds its row (RowShard, common/row_hash.h), every shard's call in flight at once, each with
// the data path's deadline. Pulled rows are scattered back to every position that named them;
// the gradients of an id named twice are summed into one row before they are pushed.
//
// On the wire: a pull's `ids` are the shard's distinct ids as little-endian uint64; a push's
// `data` is its `count` distinct ids, then count x dim float32 gradients, sent as slices of the
// caller's buffers where the batch needs no summing and one shard holds it all, of this object's
// otherwise (common/rpc/wire.h).
//
// The calls take a transport of their own (made by the owner's TransportSource: the socket data
// plane where the dense path takes it, gRPC otherwise), so that they run on another thread while
// the dense calls run on theirs (Python prefetches the next batch's rows while this one trains).
// Thread-safe: one call at a time (mu_), buffers kept across calls. Lock order: mu_, then
// member_mu_.
#ifndef SUMMA_CLIENT_SPARSE_CALLS_H_
#define SUMMA_CLIENT_SPARSE_CALLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/data_transport.h"
#include "client/row_batch.h"
#include "common/rpc/wire.h"
#include "summa/v1/summa.pb.h"

namespace summa::worker {

class SparseCalls {
 public:
  // Makes `*transport` anew where it is null or no longer fit (the socket plane's connections
  // said a token rotated since); leaves it otherwise. Called under this object's lock, so one at
  // a time, before every call. An error fails the call.
  using TransportSource = std::function<absl::Status(std::unique_ptr<DataTransport>* transport)>;

  // `shards`: the number of server shards (at least 1).
  SparseCalls(int shards, TransportSource source);
  ~SparseCalls();

  // The tables the next Join declares; a table is named by its index here.
  void set_tables(std::vector<summa::v1::EmbeddingTableSpec> tables);
  std::vector<summa::v1::EmbeddingTableSpec> tables() const;
  // Table `table`'s dimension; INVALID_ARGUMENT naming how many tables are declared for an
  // index past them, or for a table without a positive dimension.
  absl::StatusOr<int> TableDim(uint32_t table) const;

  // Who the calls speak as: the rank and each shard's session of a Join, the job's mode, the
  // calls' deadline. A rank below 0: not joined (the calls fail). The transport is made anew
  // at the next call (a restarted server may serve its plane elsewhere).
  struct Member {
    int rank = -1;
    std::vector<uint64_t> sessions;  // per shard
    summa::v1::Mode mode = summa::v1::MODE_SYNC;
    absl::Duration deadline = absl::Seconds(60);
  };
  void SetMember(Member member);

  // Fills `rows` (ids.size() x dim floats) with each id's row of `table`, as of a version at
  // least `min_version` (a shard waits until its table gets there, as a dense pull does). The
  // lowest version the shards answered. With no ids, a wait: every shard is asked for no rows,
  // and answers once its table is at min_version.
  // FAILED_PRECONDITION before a Join, INVALID_ARGUMENT for an unknown table.
  absl::StatusOr<uint64_t> Pull(uint32_t table, uint64_t min_version, absl::Span<const uint64_t> ids, float* rows);
  // Pushes the row gradients `grads` (ids.size() x dim floats) of `table` for `step`, summed
  // over `num_examples` examples (sent unchanged to every shard). In sync mode every shard gets
  // a push, an empty one (count 0) where it holds none of the ids: a table's step completes
  // when every member has pushed to it. In async and ssp modes only shards holding some of the
  // ids are called. A shard that answers ALREADY_EXISTS (a push sent again that it had
  // counted) is done. True when every shard called answered completed_step (vacuously true when
  // none was).
  absl::StatusOr<bool> Push(uint32_t table, uint64_t step, int64_t num_examples, absl::Span<const uint64_t> ids,
                            const float* grads);

  // The largest message a shard's call may carry: a batch whose share for one shard is larger
  // is refused (INVALID_ARGUMENT) before anything is sent.
  static constexpr size_t kMaxCallBytes = size_t{255} << 20;  // under common/message_size.h's

 private:
  // Checks the call (joined, a known table, the batch's size), takes the member's state and
  // the table's dim, and makes the transport fit: the call's preamble.
  absl::Status Prepare(const char* method, uint32_t table, size_t ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts requests_[s] as `method` to every shard s marked in called_, waits for them all, and
  // returns the first error (named after the method, the table and the shard); `done(s, &st)`
  // may turn a shard's error into success (a push already counted).
  absl::Status Run(DataMethod method, uint32_t table, const std::function<bool(int, const absl::Status&)>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "SparsePull of table 0 ('users')", and " on shard 1" where there are several.
  std::string CallName(DataMethod method, uint32_t table, int shard) const;

  const int shards_;
  const TransportSource source_;

  mutable absl::Mutex member_mu_;
  std::vector<summa::v1::EmbeddingTableSpec> tables_ ABSL_GUARDED_BY(member_mu_);
  Member member_ ABSL_GUARDED_BY(member_mu_);
  uint64_t member_changes_ ABSL_GUARDED_BY(member_mu_) = 0;

  // One call at a time; everything below is its state, kept across calls.
  absl::Mutex mu_;
  std::unique_ptr<DataTransport> transport_ ABSL_GUARDED_BY(mu_);
  uint64_t member_seen_ ABSL_GUARDED_BY(mu_) = 0;  // member_changes_ when transport_ was checked
  Member call_member_ ABSL_GUARDED_BY(mu_);         // the member, as of this call
  int dim_ ABSL_GUARDED_BY(mu_) = 0;                // the call's table's
  RowBatch batch_ ABSL_GUARDED_BY(mu_);
  // The distinct rows of a batch (pulled, or gradients summed to push), shard by shard, as
  // floats (grown without zeroing).
  Scratch distinct_rows_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> called_ ABSL_GUARDED_BY(mu_);        // per shard: this call has a request for it
  std::vector<absl::Status> outcome_ ABSL_GUARDED_BY(mu_);  // per shard called: how its call ended
  std::vector<grpc::ByteBuffer> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::ByteBuffer> replies_ ABSL_GUARDED_BY(mu_);
  summa::v1::SparsePullRequest pull_ ABSL_GUARDED_BY(mu_);
  summa::v1::SparsePullResponse pulled_ ABSL_GUARDED_BY(mu_);
  summa::v1::SparsePushRequest push_ ABSL_GUARDED_BY(mu_);
  summa::v1::SparsePushResponse pushed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_SPARSE_CALLS_H_
