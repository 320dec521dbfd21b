// ParameterServerService's data path (Initialize, Push, Pull, PushPull, AllReduce), served for
// gRPC's data path (server/rpc/data_path.h) and the socket plane (server/rpc/socket_plane.h)
// alike: requests parsed by the wire codec (common/rpc/wire.h) with their values in place or in a
// per-thread buffer, handed to the core, and answered from its snapshots without a copy.
#include "server/rpc/service.h"

#include <atomic>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/wire.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"
#include "server/rpc/method_roles.h"
#include "server/rpc/parked_calls.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

// What the data path's threads keep in their request buffers between calls: at most
// kKeepRequestBytes a thread (RequestValues), counted here for GetStatus.
constexpr size_t kKeepRequestBytes = 16 << 20;
std::atomic<int64_t> request_buffer_bytes{0};

// A thread's request buffer and what of it is counted in request_buffer_bytes.
struct ThreadValues {
  Scratch scratch;
  size_t counted = 0;
  ~ThreadValues() { request_buffer_bytes.fetch_sub(static_cast<int64_t>(counted), std::memory_order_relaxed); }
};
thread_local ThreadValues thread_values;

// The values of a request, read once out of gRPC's receive slices into this thread's buffer
// (its capacity kept across calls, so a step allocates nothing). Valid until the handler
// returns, which is all the core needs: it sums or applies pushed values before returning. When
// the handler is done, on every path (refusals too), a buffer that an unusually large request
// grew (a whole tensor sent in one piece) is given back, and what the thread keeps is counted.
class RequestValues {
 public:
  RequestValues() { thread_values.scratch.Clear(); }
  ~RequestValues() {
    Scratch& values = thread_values.scratch;
    if (values.capacity() > kKeepRequestBytes) values.Release();
    if (values.capacity() != thread_values.counted) {
      request_buffer_bytes.fetch_add(
          static_cast<int64_t>(values.capacity()) - static_cast<int64_t>(thread_values.counted),
          std::memory_order_relaxed);
      thread_values.counted = values.capacity();
    }
  }
  RequestValues(const RequestValues&) = delete;
  RequestValues& operator=(const RequestValues&) = delete;

  Scratch& scratch() { return thread_values.scratch; }
};

// Parses `call`'s request into `header`, the values at `path` into `*view`, on a 4-byte boundary
// (the core reads them as floats): read in place where the request is one piece of memory (the
// socket data plane's), moved down over the fields already parsed where the sender did not pad
// them onto a boundary; copied into `values` otherwise (gRPC's receive slices). The view lasts
// while the handler runs. A request in memory its sender may still write (the shared-memory
// plane's segment, DataCall::request_shared: mapped read-only) keeps its values there only with
// `*shared` given, which is then set: for a handler that reads each value once, or checks and
// sums so that a change between the two cannot matter (PushRequestView::shared); otherwise, and
// where they are off a boundary, they are copied into `values`.
absl::Status ParseRequest(DataCall& call, absl::Span<const int> path, Scratch* values, absl::string_view* view,
                          google::protobuf::MessageLite* header, bool* shared = nullptr) {
  if (shared != nullptr) *shared = false;
  if (std::optional<absl::Span<char>> whole = call.whole_request()) {
    const absl::string_view message(whole->data(), whole->size());
    if (std::optional<absl::string_view> elsewhere = call.values_elsewhere()) {
      SUMMA_RETURN_IF_ERROR(ParseInPlaceWithValues(message, *elsewhere, path, view, header));
    } else {
      SUMMA_RETURN_IF_ERROR(ParseInPlace(message, path, view, header));
    }
    const size_t off = reinterpret_cast<uintptr_t>(view->data()) % alignof(float);
    if (call.request_shared()) {
      if (shared != nullptr && off == 0) {
        *shared = true;
      } else if (!view->empty()) {
        char* to = values->Resize(view->size());
        std::memcpy(to, view->data(), view->size());
        *view = absl::string_view(to, view->size());
      }
      return absl::OkStatus();
    }
    if (off != 0) {
      // The bytes before the values are the message's own (at least `off` of them, the message
      // starting on a boundary), parsed already.
      char* to = whole->data() + (view->data() - whole->data()) - off;
      std::memmove(to, view->data(), view->size());
      *view = absl::string_view(to, view->size());
    }
    return absl::OkStatus();
  }
  absl::Status parsed = ParseWithBytes(call.request(), path, IntoScratch(values), header);
  *view = values->view();
  return parsed;
}

// The snapshot's bytes in `dtype` as a slice that gRPC sends without a copy, holding a reference
// until it is done with them. A 16-bit dtype's encoding is made once per snapshot and shared.
grpc::Slice SliceOf(const Snapshot& s, WireDType dtype = WireDType::kFloat32) {
  if (dtype == WireDType::kFloat32) {
    const absl::Span<const float> v = s.values();
    return grpc::Slice(const_cast<float*>(v.data()), v.size() * sizeof(float), &Snapshot::Return, s.Lend());
  }
  const absl::Span<const uint16_t> v = s.Encoded(dtype);
  return grpc::Slice(const_cast<uint16_t*>(v.data()), v.size() * sizeof(uint16_t), &Snapshot::Return, s.Lend());
}

absl::StatusOr<PushRequestView> ParsePush(DataCall& call, pb::PushRequest* header, Scratch* values,
                                          Tracer* tracer) {
  constexpr int kDataPath[] = {pb::PushRequest::kDataFieldNumber};
  absl::Status parsed;
  absl::string_view data;
  bool shared = false;
  {
    TraceSpan span(tracer, "receive", "server");
    parsed = ParseRequest(call, kDataPath, values, &data, header, &shared);
  }
  if (!parsed.ok()) return parsed;
  PushRequestView v;
  v.rank = header->rank();
  v.session = header->session();
  if (header->has_view()) v.view = header->view();
  v.step = header->step();
  v.partition = header->partition();
  v.num_examples = header->num_examples();
  v.dtype = WireDTypeFromProto(header->dtype(), /*unspecified_is_float32=*/false);
  if (!v.dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradients must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16, not ", DTypeName(header->dtype())));
  }
  v.sparse = header->sparse();
  if (shared && (v.sparse || *v.dtype != WireDType::kFloat32)) {
    // Decoded before they are checked (positions bounds-checked, then written to): from a copy
    // the sender cannot change. Small, being compressed.
    char* to = values->Resize(data.size());
    if (!data.empty()) std::memcpy(to, data.data(), data.size());
    data = values->view();
    shared = false;
  }
  v.data = data;
  v.peer = call.peer();
  v.shared = shared;
  return v;
}

// Fill runs under the partition's lock: the live ranks sent are the group of the step the
// version starts (an exclusion completes or restarts steps, and an admission is made, under the
// same lock). The values go in `dtype`.
std::shared_ptr<Parked> PullCall(const ParameterServer* core, DataCall* call, uint32_t partition, WireDType dtype,
                                 Parked::Holds holds) {
  const Parked::WaitSpan wait{core->options().tracer, "wait", partition};
  grpc::ByteBuffer* response = call->response();
  auto parked = std::make_shared<Parked>(call, [core, response, partition, dtype](uint64_t version, const Snapshot& w,
                                                                               bool late) {
    pb::PullResponse header;
    header.set_partition(partition);
    header.set_version(version);
    if (late) header.set_late(true);
    header.set_dtype(WireDTypeToProto(dtype));
    // The group of the step this version starts: the ranks and their view, one value.
    const GroupView group = core->membership().GroupAt(version);
    for (int r : group.ranks) header.add_live_ranks(r);
    header.set_view(group.view);
    *response = EncodeWithBytes(header, pb::PullResponse::kDataFieldNumber, SliceOf(w, dtype));
  }, wait, std::move(holds), WireDTypeBytes(dtype));
  call->Parks(parked);
  return parked;
}

void Done(DataCall* call, const absl::Status& status) { call->Answer(ToGrpcStatus(status)); }

// `count` little-endian uint64 ids from `bytes` (at any alignment) into `ids`; INVALID_ARGUMENT
// when the bytes are not `count` ids.
absl::Status ReadIds(absl::string_view bytes, uint64_t count, std::vector<uint64_t>* ids, const char* what) {
  if (bytes.size() / sizeof(uint64_t) < count || (count == 0 && !bytes.empty()) ||
      bytes.size() % sizeof(uint64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes.size(), " bytes of ids do not hold ", count,
                                                   " little-endian uint64 ids"));
  }
  ids->resize(count);
  if (count > 0) std::memcpy(ids->data(), bytes.data(), count * sizeof(uint64_t));  // data() may be null
  return absl::OkStatus();
}

// OK when `caller` may act as `rank`, the rank a request of `method` names (ActingRank).
absl::Status MayActAs(const Caller& caller, DataMethod method, int rank) {
  const absl::string_view name = DataMethodName(method);
  return ActingRank(caller, {name.data(), name.size()}, rank).status();
}

}  // namespace

int64_t ParameterServerService::request_buffer_bytes() {
  return summa::server::request_buffer_bytes.load(std::memory_order_relaxed);
}

void ParameterServerService::ServeData(DataMethod method, DataCall* call) {
  const absl::string_view name = DataMethodName(method);
  const absl::StatusOr<Caller> caller = call->Identify(*tokens_, RequiredRole({name.data(), name.size()}));
  if (!caller.ok()) return Done(call, caller.status());
  switch (method) {
    case DataMethod::kInitialize:
      return ServeInitialize(call, *caller);
    case DataMethod::kPush:
      return ServePush(call, *caller);
    case DataMethod::kPull:
      return ServePull(call, *caller);
    case DataMethod::kPushPull:
      return ServePushPull(call, *caller);
    case DataMethod::kAllReduce:
      return ServeAllReduce(call, *caller);
    case DataMethod::kSparsePull:
      return ServeSparsePull(call, *caller);
    case DataMethod::kSparsePush:
      return ServeSparsePush(call, *caller);
  }
}

void ParameterServerService::ServePush(DataCall* call, const Caller& caller) {
  pb::PushRequest header;
  RequestValues request_values;  // given back and counted when the handler returns
  Scratch& values = request_values.scratch();
  absl::StatusOr<PushRequestView> view =
      ParsePush(*call, &header, &values, core_->options().tracer);
  if (!view.ok()) return Done(call, view.status());
  if (absl::Status s = MayActAs(caller, DataMethod::kPush, view->rank); !s.ok()) return Done(call, s);
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(PeerKey(view->rank, view->peer), view->data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  absl::StatusOr<bool> completed = core_->Push(*view);
  if (completed.ok()) {
    pb::PushResponse reply;
    reply.set_completed_step(*completed);
    *call->response() = Encode(reply);
  }
  Done(call, completed.status());
}

void ParameterServerService::ServeInitialize(DataCall* call, const Caller& caller) {
  pb::InitializeRequest header;
  RequestValues request_values;  // given back and counted when the handler returns
  Scratch& values = request_values.scratch();
  constexpr int kDataPath[] = {pb::InitializeRequest::kDataFieldNumber};
  absl::string_view data;
  bool shared;  // read once (copied into the weights)
  absl::Status parsed = ParseRequest(*call, kDataPath, &values, &data, &header, &shared);
  if (!parsed.ok()) return Done(call, parsed);
  if (absl::Status s = MayActAs(caller, DataMethod::kInitialize, header.rank()); !s.ok()) return Done(call, s);
  InitializeView view;
  view.rank = header.rank();
  view.session = header.session();
  view.partition = header.partition();
  view.dtype_is_float32 = header.dtype() == pb::DTYPE_FLOAT32;
  view.data = data;
  absl::StatusOr<PeerBudget::Hold> bytes =
      in_flight_.Take(PeerKey(view.rank, call->peer()), view.data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  absl::StatusOr<bool> applied = core_->Initialize(view);
  if (applied.ok()) {
    pb::InitializeResponse reply;
    reply.set_applied(*applied);
    *call->response() = Encode(reply);
  }
  return Done(call, applied.status());
}

void ParameterServerService::ServePull(DataCall* call, const Caller& caller) {
  pb::PullRequest r;
  absl::Status parsed = ParseWithBytes(call->request(), {}, nullptr, &r);
  if (!parsed.ok()) return Done(call, parsed);
  if (absl::Status s = MayActAs(caller, DataMethod::kPull, r.rank()); !s.ok()) return Done(call, s);
  const std::optional<WireDType> dtype = WireDTypeFromProto(r.dtype(), /*unspecified_is_float32=*/true);
  if (!dtype.has_value()) {
    return Done(call, absl::InvalidArgumentError(absl::StrCat(
        "a pull's dtype must be DTYPE_FLOAT32 (or unset), DTYPE_BFLOAT16 or DTYPE_FLOAT16, not ",
        DTypeName(r.dtype()))));
  }
  const std::string peer = PeerKey(r.rank(), call->peer());
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(peer, 1);
  if (!parked.ok()) return Done(call, parked.status());
  if (r.rank() >= 0) call->OrderReply(absl::StrCat("rank ", r.rank(), " session ", r.session()), r.partition());
  core_->Pull(r.rank(), r.session(), r.partition(), r.min_version(),
              PullCall(core_, call, r.partition(), *dtype, {*std::move(parked), {}}));
}

void ParameterServerService::ServePushPull(DataCall* call, const Caller& caller) {
  pb::PushRequest header;
  RequestValues request_values;  // given back and counted when the handler returns
  Scratch& values = request_values.scratch();
  absl::StatusOr<PushRequestView> view =
      ParsePush(*call, &header, &values, core_->options().tracer);
  if (!view.ok()) return Done(call, view.status());
  if (absl::Status s = MayActAs(caller, DataMethod::kPushPull, view->rank); !s.ok()) return Done(call, s);
  const std::string peer = PeerKey(view->rank, view->peer);
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(peer, view->data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(peer, 1);
  if (!parked.ok()) return Done(call, parked.status());
  if (view->rank >= 0) call->OrderReply(absl::StrCat("rank ", view->rank, " session ", view->session), header.partition());
  // The reply comes in the dtype the push came in (a float32 push when the push's is unknown:
  // the push is refused, and the reply carries only that status).
  core_->PushPull(*view, PullCall(core_, call, header.partition(), view->dtype.value_or(WireDType::kFloat32),
                                  {*std::move(parked), {}}));
}

void ParameterServerService::ServeAllReduce(DataCall* call, const Caller& caller) {
  pb::AllReduceRequest header;
  RequestValues request_values;  // given back and counted when the handler returns
  Scratch& values = request_values.scratch();
  constexpr int kDataPath[] = {pb::AllReduceRequest::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};
  absl::string_view data;
  bool shared;  // read once (copied or added into the round's sum)
  absl::Status parsed = ParseRequest(*call, kDataPath, &values, &data, &header, &shared);
  if (!parsed.ok()) return Done(call, parsed);
  if (absl::Status s = MayActAs(caller, DataMethod::kAllReduce, header.rank()); !s.ok()) return Done(call, s);
  absl::StatusOr<TensorSpec> spec = SpecFromProto(header.tensor());
  if (!spec.ok()) return Done(call, spec.status());
  // A fixed group's rank is the caller's say-so, not an identity: its calls count against its address.
  const std::string peer = PeerKey(header.members() ? header.rank() : -1, call->peer());
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(peer, 1);
  if (!parked.ok()) return Done(call, parked.status());
  // The contribution's bytes are held until the round completes (the call is answered then).
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(peer, data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  auto answer = std::make_shared<Parked>(
      call,
      [response = call->response(), spec = *spec](uint64_t round, const Snapshot& sum, bool) {
        pb::Tensor tensor;
        SpecToProto(spec, &tensor);
        pb::AllReduceResponse outer;
        outer.set_round(round - 1);
        *response = EncodeWithNestedBytes(outer, pb::AllReduceResponse::kTensorFieldNumber, tensor,
                                          pb::Tensor::kDataFieldNumber, SliceOf(sum));
      },
      Parked::WaitSpan{core_->options().tracer, "allreduce wait"},
      Parked::Holds{*std::move(parked), *std::move(bytes)});
  call->Parks(answer);
  AllReduceContribution c;
  c.name = header.name();
  c.group_size = header.group_size();
  c.rank = header.rank();
  c.members = header.members();
  c.round = header.round();
  c.session = header.session();
  c.spec = *std::move(spec);
  c.data = data;
  c.peer = peer;
  hub_->Contribute(c, std::move(answer));
}

void ParameterServerService::ServeSparsePull(DataCall* call, const Caller& caller) {
  pb::SparsePullRequest r;
  absl::Status parsed = ParseWithBytes(call->request(), {}, nullptr, &r);
  if (!parsed.ok()) return Done(call, parsed);
  if (absl::Status s = MayActAs(caller, DataMethod::kSparsePull, r.rank()); !s.ok()) return Done(call, s);
  SparsePullView view;
  view.rank = r.rank();
  view.session = r.session();
  view.table = r.table();
  view.min_version = r.min_version();
  if (absl::Status s = ReadIds(r.ids(), r.ids().size() / sizeof(uint64_t), &view.ids, "a sparse pull"); !s.ok()) {
    return Done(call, s);
  }
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(PeerKey(r.rank(), call->peer()), 1);
  if (!parked.ok()) return Done(call, parked.status());
  grpc::ByteBuffer* response = call->response();
  auto answer = std::make_shared<Parked>(
      call,
      [response, table = r.table()](uint64_t version, const Snapshot& rows, bool) {
        pb::SparsePullResponse header;
        header.set_table(table);
        header.set_version(version);
        *response = EncodeWithBytes(header, pb::SparsePullResponse::kRowsFieldNumber, SliceOf(rows));
      },
      Parked::WaitSpan{core_->options().tracer, "sparse wait"}, Parked::Holds{*std::move(parked), {}});
  call->Parks(answer);
  core_->SparsePull(std::move(view), std::move(answer));
}

void ParameterServerService::ServeSparsePush(DataCall* call, const Caller& caller) {
  pb::SparsePushRequest header;
  RequestValues request_values;  // given back and counted when the handler returns
  Scratch& values = request_values.scratch();
  constexpr int kDataPath[] = {pb::SparsePushRequest::kDataFieldNumber};
  absl::string_view data;
  absl::Status parsed = ParseRequest(*call, kDataPath, &values, &data, &header);
  if (!parsed.ok()) return Done(call, parsed);
  if (absl::Status s = MayActAs(caller, DataMethod::kSparsePush, header.rank()); !s.ok()) return Done(call, s);
  const uint64_t count = header.count();
  const uint64_t id_bytes = count * sizeof(uint64_t);
  if (data.size() < id_bytes || (data.size() - id_bytes) % sizeof(float) != 0) {
    return Done(call, absl::InvalidArgumentError(absl::StrCat("a sparse push of ", count, " rows sends ", data.size(),
                                                              " bytes: fewer than its ids, or not ids then float32 rows")));
  }
  thread_local std::vector<uint64_t> ids;
  ids.resize(count);
  if (count > 0) std::memcpy(ids.data(), data.data(), id_bytes);  // data() may be null when empty
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(PeerKey(header.rank(), call->peer()), data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  SparsePushView view;
  view.rank = header.rank();
  view.session = header.session();
  view.table = header.table();
  view.step = header.step();
  view.num_examples = header.num_examples();
  view.ids = ids;
  // The values follow the ids: on a 4-byte boundary, as ParseRequest put the field on one.
  view.grads = absl::MakeConstSpan(reinterpret_cast<const float*>(data.data() + id_bytes),
                                   (data.size() - id_bytes) / sizeof(float));
  absl::StatusOr<bool> completed = core_->SparsePush(view);
  if (completed.ok()) {
    pb::SparsePushResponse reply;
    reply.set_completed_step(*completed);
    if (absl::StatusOr<EmbeddingTable*> table = core_->Table(view.table); table.ok()) {
      reply.set_version((*table)->version());
    }
    *call->response() = Encode(reply);
  }
  Done(call, completed.status());
}

}  // namespace summa::server
