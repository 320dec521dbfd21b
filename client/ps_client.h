// ParameterClient: the worker's side of summa.v1.ParameterServer, the ParameterStore the trainer
// uses outside tests. Joins (retrying while the server is not up or the model not yet defined),
// pulls, and push-pulls the flat gradient and weight buffers partition by partition, all
// partitions in flight at once, spread over `channels` connections. The data path is raw
// (common/rpc/wire.h): a pushed gradient goes out as a slice of the caller's buffer (no copy), and a
// reply's values are copied once, from gRPC's receive slices straight into the caller's weights.
// In a job whose server asks for another wire format (--wire_dtype, --compress), pushes go out
// as PushEncoder (client/push_encoder.h) encodes them and pulls are widened to float32.
// Every call carries a deadline. Not thread-safe, except Heartbeat, which a second thread may
// call at any time, and the embedding tables' calls (SparsePull, SparsePush), which another
// thread may call while the dense calls run (they have a transport and a lock of their own,
// client/sparse_calls.h); during a Join they fail (FAILED_PRECONDITION) or are refused.
#ifndef SUMMA_CLIENT_PS_CLIENT_H_
#define SUMMA_CLIENT_PS_CLIENT_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/compression.h"
#include "common/partition_map.h"
#include "common/tensor.h"
#include "common/trace.h"
#include "common/rpc/data_method.h"
#include "common/rpc/socket_tls.h"
#include "common/rpc/transport.h"
#include "summa/v1/summa.grpc.pb.h"
#include "client/data_transport.h"
#include "client/parameter_store.h"
#include "client/shard_agreement.h"
#include "client/push_encoder.h"
#include "client/socket_calls.h"
#include "client/sparse_calls.h"

namespace summa::worker {

// Which transport the data path (Initialize, Push, Pull, PushPull, AllReduce) takes. kAuto:
// the socket data plane (common/rpc/socket_frame.h) where every shard offers one and it can be
// reached, gRPC otherwise, and for each shard on this host that offers it the shared-memory
// plane before the socket plane; kGrpc: always gRPC; kSocket: the socket data plane or an error;
// kShm: every shard's shared-memory plane (this host's) or an error.
enum class DataPlane { kAuto, kGrpc, kSocket, kShm };
// "auto", "grpc", "socket" or "shm": the spellings of summa-worker --data_plane.
const char* DataPlaneName(DataPlane plane);
// A DataPlaneName; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name);

class ParameterClient final : public ParameterStore {
 public:
  // `address` is host:port of summa-server, or of every shard of a sharded job, comma-separated
  // in shard order (summa-server --shard=I --shards=K): each partition goes to the shard that
  // holds it, every shard's calls in flight at once. `call_deadline` bounds each RPC (a
  // push-pull waits for the slowest worker, so keep it longer than the server's barrier
  // deadline); `join_deadline` bounds each shard's join with retries. `channels` (at least 1)
  // TCP connections to each shard carry its partitions, partition i on channel i % channels.
  ParameterClient(const std::string& address, absl::Duration call_deadline,
                  absl::Duration join_deadline, int channels = 1, ClientSecurity security = {});
  ~ParameterClient() override;

  // ParameterStore:
  absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                const float* initial, const std::string& status_address) override;
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) override;
  absl::StatusOr<uint64_t> PushPull(uint64_t step, int64_t num_examples, const float* gradients, float* weights,
                                    std::vector<int>* live_ranks) override;
  absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float* gradients) override;
  absl::Status Heartbeat(int rank) const override;
  absl::Status Leave(int rank) override;
  absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                               const std::vector<float>& values) override;
  std::string address() const override { return address_; }
  ParameterClient* staged_client() override { return this; }

  // The AllReduce of `values` into `sum` (of the same length; it may be `values` itself).
  // Tensors over kAllReduceChunkBytes travel as chunks, each a collective of its own (named
  // "<name>/<k>of<n>"), all in flight at once, so that the server sums them in parallel; with
  // several shards a fixed group's chunks are spread over them (PlanAllReduce). Every rank of a
  // group must list the same number of shards, or their chunks never meet.
  absl::Status AllReduceInto(const Collective& group, absl::Span<const float> values, absl::Span<float> sum);
  static constexpr int64_t kAllReduceChunkBytes = summa::kAllReduceChunkBytes;  // common/partition_map.h
  // How a tensor of `floats` values is cut: `count` chunks, chunk k the values Range(k) (begin,
  // length), summed by shard Shard(k). One server (or a group of the job's members, whose
  // collectives stay on shard 0, the keeper of the membership view): chunks of
  // kAllReduceChunkBytes and a shorter tail, as every summa.v1 client cuts them. A fixed group on
  // several shards: at least one chunk a shard where each holds kMinSpreadChunkBytes, a multiple
  // of the shard count where there are as many, all of one size (the last up to `count` values
  // shorter), dealt round the shards, so that each sums an equal share.
  struct AllReducePlan {
    int64_t floats = 0;
    int64_t chunk_floats = 0;
    int64_t count = 1;
    int shards = 1;
    std::pair<int64_t, int64_t> Range(int64_t k) const {
      const int64_t begin = std::min(floats, k * chunk_floats);
      return {begin, std::min(floats, begin + chunk_floats) - begin};
    }
    int Shard(int64_t k) const { return static_cast<int>(k % shards); }
  };
  static AllReducePlan PlanAllReduce(int64_t floats, int shards, bool members);
  static constexpr int64_t kMinSpreadChunkBytes = 256 << 10;

  // A step exchanged partition by partition, overlapping the caller's compute (StepExchange,
  // client/step_exchange.h, drives it from a thread of its own). BeginStaged readies step `step`
  // (no call yet): `gradients` and `weights` stay alive until every staged call has ended, and
  // partition i's gradients unchanged from StartStaged(i) until its call ends. StartStaged(i)
  // push-pulls partition i; NextStaged collects the calls as they end, each partition's new
  // weights written into `weights` before it is handed back. A push refused for a stale view
  // goes again as in PushPull. A 16-bit wire (--wire_dtype) encodes partition i in StartStaged(i);
  // with top-k (--compress) the whole gradient is encoded at once: StartStaged only marks
  // partitions until the last, then starts them all. Not thread-safe, except WakeStaged.
  absl::Status BeginStaged(uint64_t step, int64_t num_examples, const float* gradients, float* weights);
  void StartStaged(size_t i);
  // Waits for the next staged call to end: true with its partition and outcome (OK once its
  // weights are in). False when none is in flight, when WakeStaged was called, or when a refused
  // push went again (the caller looks for partitions made ready meanwhile).
  bool NextStaged(size_t* partition, absl::Status* status);
  // Makes a NextStaged in progress (or the next) return false. Thread-safe, but only between
  // BeginStaged and the end of the step's calls.
  void WakeStaged() { transport_->Wake(); }
  size_t staged_in_flight() const { return staged_in_flight_; }
  // The group the last staged reply named (the step's live ranks).
  const std::vector<int>& staged_live_ranks() const { return staged_live_ranks_; }
  // The group partition i's staged reply named. Thread-safe once that call has ended OK (its
  // NextStaged returned), until the partition's next call starts.
  std::vector<int> staged_live_ranks_of(size_t i) const {
    return {pull_headers_[i].live_ranks().begin(), pull_headers_[i].live_ranks().end()};
  }
  // The job's embedding tables (summa.v1 EmbeddingTableSpec), declared by the next Join
  // (JoinRequest.tables): table t is tables[t]. Before Join.
  void set_tables(std::vector<summa::v1::EmbeddingTableSpec> tables) { sparse_->set_tables(std::move(tables)); }
  // Table `table`'s row length; INVALID_ARGUMENT naming how many tables are declared otherwise.
  absl::StatusOr<int> TableDim(uint32_t table) const { return sparse_->TableDim(table); }
  // Fills `rows` (ids.size() x dim floats) with each id's row of table `table`, as of a version
  // at least `min_version`; the lowest version the shards answered. Each distinct id is pulled
  // once, from the shard that holds it. See SparseCalls::Pull. Thread-safe.
  absl::StatusOr<uint64_t> SparsePull(uint32_t table, uint64_t min_version, absl::Span<const uint64_t> ids,
                                      float* rows) {
    return sparse_->Pull(table, min_version, ids, rows);
  }
  // Pushes the row gradients `grads` (ids.size() x dim floats) of table `table` for `step`
  // (duplicate ids' rows summed; in sync mode every shard gets a push, empty where it holds
  // none of the ids); true when every shard completed its step. See SparseCalls::Push.
  // Thread-safe.
  absl::StatusOr<bool> SparsePush(uint32_t table, uint64_t step, int64_t num_examples,
                                  absl::Span<const uint64_t> ids, const float* grads) {
    return sparse_->Push(table, step, num_examples, ids, grads);
  }

  // Where the server cut the model (after Join), in offset order.
  const std::vector<PartitionRange>& partitions() const { return partitions_; }

  // Records every partition's push-pull (from its start to its reply) when not null. Not owned;
  // outlives the client.
  void set_tracer(Tracer* tracer) { tracer_ = tracer; }
  // A push refused for a stale membership view, or dropped with its step when the step started
  // again under a new group, goes back to the caller (ABORTED, IsStaleView) instead of being
  // sent again as it is: a caller that splits the batch over the group (summa-worker) computes
  // its new shard of the step, so that every example is summed once. Off by default: the same
  // gradient goes again (a caller that cannot redo a step, as a user's PyTorch loop).
  void set_recompute_on_stale_view(bool on) { recompute_on_stale_view_ = on; }
  // The caller takes a DiLoCo job's local steps and pushes pseudo-gradients (JoinRequest's
  // takes_local_steps): without it a DiLoCo server refuses the Join. Off by default.
  void set_takes_local_steps(bool on) { takes_local_steps_ = on; }
  // The data path's transport (kAuto unless set). The choice is made at the first data-path
  // call and again after every Join (a restarted server may serve its plane on another port).
  void set_data_plane(DataPlane plane) {
    data_plane_ = plane;
    plane_chosen_ = false;
  }
  // Whether the data path's calls go over the socket data plane now (false before the first);
  // the shared-memory plane is one too.
  bool on_socket_plane() const { return transport_ != nullptr && transport_->socket_plane(); }
  // Whether they go over the shared-memory plane (every shard's).
  bool on_shm_plane() const { return transport_ != nullptr && transport_->shm(); }
  // On the shared-memory plane (chosen now if not yet): `floats` zeroed floats in a segment the
  // shards map read-only (common/shared_segment.h), which lives as long as this client. Gradients
  // pushed from them are named there, not copied (the caller's flat buffer: a push from it
  // copies nothing). nullptr on any other plane. Once per client; FAILED_PRECONDITION asked again.
  absl::StatusOr<float*> SharedValues(size_t floats) override;

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // A server, or one shard of a sharded job.
  struct Shard {
    std::string address;
    std::unique_ptr<summa::v1::ParameterServer::Stub> stub;  // the control calls
    std::vector<std::unique_ptr<grpc::GenericStub>> generic;  // the data path, one per channel
    std::atomic<uint64_t> session{0};  // from the last Join; Heartbeat reads it from another thread
    // The newest membership view the shard told this worker (Join, pulls, Heartbeat, which may
    // run on another thread): the stamp on pushes to it.
    std::atomic<uint64_t> view{0};
  };
  // One data-path call: the method, the request and reply buffers (alive until it ends), and
  // the shard it goes to (a members' collective: shard 0, the coordinator).
  struct CallSpec {
    DataMethod method;
    const grpc::ByteBuffer* request;
    grpc::ByteBuffer* reply;
    int shard = 0;
    absl::Duration timeout = absl::InfiniteDuration();  // less than the call deadline, if so
  };
  // A member call of the stub that names only a rank and its session (Heartbeat, Leave).
  template <typename Request, typename Response>
  using ShardMethod = grpc::Status (summa::v1::ParameterServer::Stub::*)(grpc::ClientContext*, const Request&,
                                                                          Response*);
  // Calls `method` on `shard` as `rank` with that shard's session, within `deadline`; the reply
  // into `response` where given.
  template <typename Request, typename Response>
  absl::Status CallShard(const Shard& shard, int rank, absl::Duration deadline,
                         ShardMethod<Request, Response> method, Response* response = nullptr) const;
  // CallShard on every shard, whatever another answers; the first error. `answered(shard, its
  // reply)`, where given, for each shard that answered OK.
  template <typename Request, typename Response>
  absl::Status EveryShard(int rank, absl::Duration deadline, ShardMethod<Request, Response> method,
                          const std::function<void(Shard&, const Response&)>& answered = nullptr) const;
  // Joins shard `index` (retrying while it is not up, within join_deadline_), heartbeating the
  // shards before it (joined already) while it waits.
  absl::StatusOr<summa::v1::JoinResponse> JoinShard(size_t index, const summa::v1::JoinRequest& request);
  // Starts the call `start(i)` describes for each i in [0, n) at once and waits for all;
  // `what(i)` names call i in an error, `trace_name` its span in the trace. A call that fails
  // is started again at once (start(i) anew, the others still in flight) when `again(i, &its
  // status)` says so; `again` may change the status it declines. The first error.
  absl::Status ForEach(size_t n, absl::FunctionRef<CallSpec(size_t)> start,
                       absl::FunctionRef<std::string(size_t)> what, const char* trace_name,
                       const std::function<bool(size_t, absl::Status*)>& again = nullptr);
  // Decides, once (and again after a Join), which transport ForEach's calls take (transport_).
  // An error only where data_plane_ is kSocket.
  absl::Status ChooseDataPlane();
  // The socket data plane's connections to every shard, as data_plane_ asks, with the TLS
  // context in `*tls` (made here when needed) and the token in `*token` (the one its hellos
  // said). Null where the data path goes over gRPC: not asked for, not offered, or not reached
  // (`*ask_again`: the server did not answer; ask at the next call); an error only where
  // data_plane_ is kSocket. With `log`, the choice (and an unexpected reason for gRPC) goes to
  // the log. Thread-safe (the sparse calls' transport is made on their thread), given a `tls`
  // and `token` of the caller's own.
  absl::StatusOr<std::unique_ptr<DataTransport>> OpenSocketPlane(std::unique_ptr<socket_plane::TlsContext>* tls,
                                                                 std::string* token, bool* ask_again,
                                                                 bool log) const;
  // The sparse calls' TransportSource: their own transport, on the plane OpenSocketPlane finds.
  absl::Status RefreshSparseTransport(std::unique_ptr<DataTransport>* transport);
  std::unique_ptr<DataTransport> NewGrpcTransport() const;
  // ForEach over the partitions, each call to its partition's shard, named after its partition.
  absl::Status ForEachPartition(absl::FunctionRef<CallSpec(size_t)> start, const char* trace_name,
                                const std::function<bool(size_t, absl::Status*)>& again = nullptr);
  // Sends the initial values of every partition of the shards marked in `initialize` (their Join
  // answered `initialize`), a window of partitions at a time.
  absl::Status SendInitialValues(const float* initial, const std::vector<bool>& initialize);
  // Pushes (`method`: kPush or kPushPull) of `step` for every partition. A push refused for a
  // stale membership view (a member left or was dropped since this worker heard its shard's
  // view) goes again as soon as the refusal arrives, stamped with the view a Heartbeat to that
  // shard tells (at once, not after the other calls: in sync mode those wait on other workers'
  // pushes, which may wait on this one). Still stale after three refreshes, it fails with
  // UNAVAILABLE, which the trainer answers by joining again. Each send has its own deadline, so
  // a partition's pushes take at most 4 call deadlines and 3 Heartbeats' 5 s.
  absl::Status SendPushes(DataMethod method, const char* trace_name, uint64_t step, int64_t num_examples,
                          const float* gradients);
  // Whether a push of `step` to partition i refused with `*refused` goes again (refreshing the
  // shard's view from a Heartbeat; `*refreshes` counts them); false with `*refused` the error.
  bool RetryRefusedPush(size_t i, uint64_t step, int* refreshes, absl::Status* refused);
  // Partition i's push: its header, then its slice of `gradients`, sent without a copy.
  void EncodePush(size_t i, uint64_t step, int64_t num_examples, const float* gradients);
  // Reads partition i's pull reply: the header into pull_headers_[i], the values into `weights`.
  absl::Status DecodePull(size_t i, float* weights);
  // Starts the staged step's push-pull of partition i (encoded, stamped with its shard's view).
  void LaunchStaged(size_t i);
  // DecodePull of a push-pull of `step`: in sync mode the reply must be version step + 1, or,
  // where `may_skip` and the server marked the push late (PullResponse.late: backup workers), a
  // later version; a late reply the caller cannot skip from is FAILED_PRECONDITION (reason
  // kLatePush).
  absl::Status DecodePushPull(size_t i, uint64_t step, float* weights, bool may_skip = false);
  // Pulls the partitions whose pull_headers_ version is below the highest until every one is at
  // the same version (they are a step apart at most, but may move on meanwhile); that version.
  // UNAVAILABLE when they keep moving.
  absl::StatusOr<uint64_t> PullToOneVersion(float* weights);
  // Sets up the wire format the server asked for at a Join that resumes this rank at
  // `next_step` (see PushEncoder::Rejoined for top-k's residuals).
  void SetWireFormat(WireDType dtype, Compression compression, uint64_t next_step);

  const std::string address_;
  const absl::Duration call_deadline_;
  // The data path's calls: call_deadline_, times H in a DiLoCo job (a push-pull there waits for
  // every member's H local steps, as the server's barrier deadline does). Set at each Join.
  absl::Duration data_deadline_ = call_deadline_;
  const absl::Duration join_deadline_;
  const ClientToken token_;  // sent with every call (none when empty); its file read again when it changes
  // The token the socket data plane's connections said in their hellos: a rotated one (token_
  // changed) has the plane's connections made again (ChooseDataPlane).
  std::string plane_token_;
  const TlsFiles tls_;  // the CA it trusts, and its certificate for mutual TLS; none: plaintext
  // The socket plane's TLS context, made at the first TLS plane (it outlives the transport).
  std::unique_ptr<socket_plane::TlsContext> plane_tls_;
  DataPlane data_plane_ = DataPlane::kAuto;
  bool plane_chosen_ = false;
  std::vector<std::unique_ptr<Shard>> shards_;
  // The data path's calls: on gRPC or the socket data plane (ChooseDataPlane). Declared after
  // shards_, whose stubs the gRPC transport borrows: it goes first.
  SharedSegment values_;  // SharedValues'; every shared-memory transport is given it (outlives them)
  std::unique_ptr<DataTransport> transport_;
  std::vector<absl::Time> call_begun_;  // ForEach's calls, when traced
  int rank_ = -1;
  summa::v1::Mode mode_ = summa::v1::MODE_SYNC;
  int backup_workers_ = 0;  // JoinInfo::backup_workers
  std::vector<PartitionRange> partitions_;  // every shard's, in offset order
  std::vector<int> shard_of_;               // per partition: the shard that holds it
  // One request, reply and header per partition, reused across steps.
  std::vector<summa::v1::PushRequest> push_headers_;
  std::vector<summa::v1::PullRequest> pull_requests_;
  std::vector<grpc::ByteBuffer> requests_;
  std::vector<grpc::ByteBuffer> replies_;
  // AllReduce's, per chunk: members, as the other calls' are, because the shared-memory plane's
  // transport may still write a reply it moves aside after the call that wanted it returned.
  std::vector<grpc::ByteBuffer> allreduce_requests_;
  std::vector<grpc::ByteBuffer> allreduce_replies_;
  std::vector<summa::v1::PullResponse> pull_headers_;
  std::vector<std::string> partition_names_;  // "partition <id>", for errors
  // The pushes in the job's wire format, and per partition a pull reply's 16-bit values before
  // they are widened.
  PushEncoder encoder_;
  std::vector<std::vector<uint16_t>> pulled_;
  Tracer* tracer_ = nullptr;
  // The staged step (BeginStaged).
  struct Staged {
    uint64_t step = 0;
    int64_t num_examples = 0;
    const float* gradients = nullptr;
    float* weights = nullptr;
    std::vector<int> refreshes;  // per partition
    std::vector<bool> marked;    // encoded pushes: partitions StartStaged named, not yet started
    size_t unmarked = 0;
  } staged_;
  size_t staged_in_flight_ = 0;
  bool recompute_on_stale_view_ = false;
  bool takes_local_steps_ = false;
  std::vector<int> staged_live_ranks_;
  // The sparse calls' own socket plane state, as plane_tls_, plane_token_ and plane_chosen_ are
  // the dense path's: touched only by RefreshSparseTransport, which sparse_ calls under its lock.
  std::unique_ptr<socket_plane::TlsContext> sparse_plane_tls_;
  std::string sparse_plane_token_;
  bool sparse_plane_chosen_ = false;
  // The embedding tables' calls. Declared last: it goes first, with its transport, which borrows
  // shards_' stubs and sparse_plane_tls_.
  std::unique_ptr<SparseCalls> sparse_;
};

}  // namespace summa::worker

#endif  // SUMMA_CLIENT_PS_CLIENT_H_
