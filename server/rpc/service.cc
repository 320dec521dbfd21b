#include "server/rpc/service.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"
#include "common/logging.h"
#include "common/rpc/wire.h"
#include "server/rpc/method_roles.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

// What a call answered without values is filled with (a held report reads the membership).
const Snapshot& NoSnapshot() {
  static const Snapshot none;
  return none;
}

// A call that waits to be answered. The claim flag decides between the core answering and the
// client cancelling (or a timer); only the winner fills the response and sends the answer.
class Parked final : public ParkedCall {
 public:
  using FillFn = std::function<void(uint64_t, const Snapshot&)>;

  // What the trace calls the time from the call's arrival to its answer.
  struct WaitSpan {
    Tracer* tracer = nullptr;  // Not owned; may be null.
    const char* name = "wait";
    int64_t partition = -1;
  };

  // The shares of the server's limits the call holds: `parked` until it is answered, `bytes`
  // until it is forgotten too.
  struct Holds {
    PeerBudget::Hold parked;
    PeerBudget::Hold bytes;
  };

  // `answer` is not owned; alive until its Answer has been called.
  Parked(Answerable* answer, FillFn fill, WaitSpan wait, Holds holds, int value_bytes = 4)
      : answer_(answer), fill_(std::move(fill)), wait_(wait),
        arrived_(wait.tracer != nullptr ? absl::Now() : absl::InfinitePast()), holds_(std::move(holds)),
        value_bytes_(value_bytes) {}
  bool Claim() override { return !claimed_.exchange(true); }
  bool claimed() const override { return claimed_.load(); }
  void Fill(uint64_t counter, const Snapshot& values) override {
    if (wait_.tracer != nullptr) wait_.tracer->Complete(wait_.name, "server", arrived_, absl::Now(), wait_.partition);
    fill_(counter, values);
  }
  // An answered call is no longer parked: its parked-call hold goes now, its bytes when it is
  // forgotten (an AllReduce contribution's stay in the round's sum until the round ends).
  void Finish(absl::Status status) override {
    holds_.parked.Release();
    answer_->Answer(ToGrpcStatus(status));
  }
  int value_bytes() const override { return value_bytes_; }

 private:
  std::atomic<bool> claimed_{false};
  Answerable* const answer_;
  const FillFn fill_;
  const WaitSpan wait_;
  const absl::Time arrived_;
  Holds holds_;
  const int value_bytes_;
};

// A synchronous handler's call that waits, on its own thread, to be answered through a Parked
// call (a held shard report).
class BlockedCall final : public Answerable {
 public:
  void Answer(const grpc::Status& status) override {
    status_ = status;
    answered_.Notify();
  }
  // Waits up to `wait` for the answer; answers the call itself when no one did by then (OK,
  // filled with no values) or when the client went away first (CANCELLED; looked at every
  // kCancelCheck). Returns the answer's status.
  static constexpr absl::Duration kCancelCheck = absl::Milliseconds(50);
  grpc::Status Wait(const grpc::ServerContext& context, Parked& call, absl::Duration wait) {
    const absl::Time end = absl::Now() + wait;
    while (!answered_.WaitForNotificationWithTimeout(std::min(kCancelCheck, end - absl::Now()))) {
      if (context.IsCancelled()) {
        if (call.Claim()) call.Finish(absl::CancelledError("cancelled by the client"));
        break;
      }
      if (absl::Now() >= end) {
        if (call.Claim()) {
          call.Fill(0, NoSnapshot());
          call.Finish(absl::OkStatus());
        }
        break;
      }
    }
    answered_.WaitForNotification();  // by whoever claimed it
    return status_;
  }

 private:
  absl::Notification answered_;
  grpc::Status status_;
};

// The values of a request, read once out of gRPC's receive slices into this thread's buffer
// (its capacity kept across calls, so a step allocates nothing). Valid until the handler
// returns, which is all the core needs: it sums or applies pushed values before returning.
Scratch& RequestValues() {
  thread_local Scratch values;
  values.Clear();
  return values;
}

// Parses `call`'s request into `header`, the values at `path` into `*view`, on a 4-byte boundary
// (the core reads them as floats): read in place where the request is one piece of memory (the
// socket data plane's), moved down over the fields already parsed where the sender did not pad
// them onto a boundary; copied into `values` otherwise (gRPC's receive slices). The view lasts
// while the handler runs.
absl::Status ParseRequest(DataCall& call, absl::Span<const int> path, Scratch* values, absl::string_view* view,
                          google::protobuf::MessageLite* header) {
  if (std::optional<absl::Span<char>> whole = call.whole_request()) {
    SUMMA_RETURN_IF_ERROR(ParseInPlace(absl::string_view(whole->data(), whole->size()), path, view, header));
    const size_t off = reinterpret_cast<uintptr_t>(view->data()) % alignof(float);
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

// Gives back a buffer that an unusually large request grew (a whole tensor sent in one piece).
void TrimRequestValues(Scratch& values) {
  constexpr size_t kKeepBytes = 16 << 20;
  if (values.capacity() > kKeepBytes) values.Release();
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
  {
    TraceSpan span(tracer, "receive", "server");
    parsed = ParseRequest(call, kDataPath, values, &data, header);
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
  v.data = data;
  v.peer = call.peer();
  return v;
}

// The longest a follower's report is held (ShardReport.wait_ms).
constexpr absl::Duration kMaxFollowWait = absl::Seconds(30);

// Fill runs under the partition's lock: the live ranks sent are those the step was answered
// under (an exclusion completes steps under the same lock). The values go in `dtype`.
std::shared_ptr<Parked> PullCall(const ParameterServer* core, DataCall* call, uint32_t partition, WireDType dtype,
                                 Parked::Holds holds) {
  const Parked::WaitSpan wait{core->options().tracer, "wait", partition};
  grpc::ByteBuffer* response = call->response();
  auto parked = std::make_shared<Parked>(call, [core, response, partition, dtype](uint64_t version, const Snapshot& w) {
    pb::PullResponse header;
    header.set_partition(partition);
    header.set_version(version);
    header.set_dtype(WireDTypeToProto(dtype));
    for (int r : core->LiveRanks()) header.add_live_ranks(r);
    header.set_view(core->view());
    *response = EncodeWithBytes(header, pb::PullResponse::kDataFieldNumber, SliceOf(w, dtype));
  }, wait, std::move(holds), WireDTypeBytes(dtype));
  call->Parks(parked);
  return parked;
}

void Done(DataCall* call, const absl::Status& status) { call->Answer(ToGrpcStatus(status)); }

}  // namespace

grpc::Status ParameterServerService::Authorize(const grpc::ServerContextBase& context,
                                               std::string_view method) const {
  return ToGrpcStatus(tokens_->Check(context, RequiredRole(method)));
}

void ParameterServerService::ServeData(DataMethod method, DataCall* call) {
  const absl::string_view name = DataMethodName(method);
  if (absl::Status auth = call->Authorize(*tokens_, RequiredRole({name.data(), name.size()})); !auth.ok()) {
    return Done(call, auth);
  }
  switch (method) {
    case DataMethod::kInitialize:
      return ServeInitialize(call);
    case DataMethod::kPush:
      return ServePush(call);
    case DataMethod::kPull:
      return ServePull(call);
    case DataMethod::kPushPull:
      return ServePushPull(call);
    case DataMethod::kAllReduce:
      return ServeAllReduce(call);
  }
}

grpc::Status ParameterServerService::Join(grpc::ServerContext* context, const pb::JoinRequest* request,
                                          pb::JoinResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Join"); !denied.ok()) return denied;
  if (absl::Status rate = joins_.Take(); !rate.ok()) return ToGrpcStatus(rate);
  JoinRequestView view;
  view.rank = request->rank();
  view.world_size = request->world_size();
  view.peer = context->peer();
  view.status_address = request->status_address();
  view.values_follow = request->values_follow();
  for (const pb::Tensor& t : request->params()) {
    absl::StatusOr<TensorSpec> spec = SpecFromProto(t);
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    view.params.push_back({*std::move(spec), t.data()});
  }
  absl::StatusOr<JoinResult> joined = core_->Join(view);
  if (!joined.ok()) return ToGrpcStatus(joined.status());
  response->set_rank(joined->rank);
  response->set_session(joined->session);
  response->set_world_size(core_->options().world_size);
  response->set_mode(ModeToProto(core_->options().mode));
  response->set_version(joined->version);
  response->set_next_step(joined->next_step);
  response->set_partition_bytes(core_->options().partition_bytes);
  response->set_lease_seconds(absl::ToDoubleSeconds(core_->options().lease));
  response->set_staleness(core_->options().staleness);
  response->set_initialize(joined->initialize);
  response->set_wire_dtype(WireDTypeToProto(core_->options().wire_dtype));
  response->set_topk_ratio(core_->options().compression.topk_ratio);
  response->set_shard(core_->options().shard);
  response->set_shards(core_->options().shards);
  for (int r : joined->live_ranks) response->add_live_ranks(r);
  for (uint64_t v : joined->checkpoint_versions) response->add_checkpoint_versions(v);
  response->set_restored(joined->restored);
  response->set_view(joined->view);
  for (const PartitionRange& p : joined->partitions) {
    pb::Partition* out = response->add_partitions();
    out->set_id(p.id);
    out->set_offset(p.offset);
    out->set_length(p.length);
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Heartbeat(grpc::ServerContext* context, const pb::HeartbeatRequest* request,
                                               pb::HeartbeatResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Heartbeat"); !denied.ok()) return denied;
  absl::Status s = core_->Heartbeat(request->rank(), request->session());
  if (s.ok()) {
    const StatusSnapshot status = core_->Status();
    response->set_version(status.version);
    response->set_view(status.view);
  }
  return ToGrpcStatus(s);
}

grpc::Status ParameterServerService::Leave(grpc::ServerContext* context, const pb::LeaveRequest* request,
                                           pb::LeaveResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Leave"); !denied.ok()) return denied;
  return ToGrpcStatus(core_->Leave(request->rank(), request->session()));
}

grpc::Status ParameterServerService::Checkpoint(grpc::ServerContext* context, const pb::CheckpointRequest* request,
                                                pb::CheckpointResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Checkpoint"); !denied.ok()) return denied;
  if (core_->options().checkpoint_dir.empty()) {
    return ToGrpcStatus(absl::FailedPreconditionError("no --checkpoint_dir: this server does not write checkpoints"));
  }
  // Written by the daemon's thread, which writes the periodic checkpoints too: one at a time.
  absl::Status s;
  OnDaemonThread([&] { s = core_->MaybeCheckpoint(/*force=*/true); });
  if (s.ok()) {
    const StatusSnapshot status = core_->Status();
    response->set_path(status.checkpoint.path);
    response->set_version(status.checkpoint.version);
  }
  return ToGrpcStatus(s);
}

grpc::Status ParameterServerService::RollBack(grpc::ServerContext* context, const pb::RollBackRequest* request,
                                              pb::RollBackResponse* response) {
  if (grpc::Status denied = Authorize(*context, "RollBack"); !denied.ok()) return denied;
  // Reads a checkpoint file: on the daemon's thread, one at a time with the checkpoints it writes.
  absl::StatusOr<bool> rolled;
  OnDaemonThread([&] {
    rolled = core_->RollBack(request->rank(), request->session(), request->to_version(), request->from_version());
  });
  if (rolled.ok()) {
    response->set_rolled_back(*rolled);
    response->set_version(request->to_version());
  }
  return ToGrpcStatus(rolled.status());
}

void ParameterServerService::OnDaemonThread(absl::FunctionRef<void()> task) {
  absl::Notification done;
  background_([&] {
    task();
    done.Notify();
  });
  done.WaitForNotification();
}

grpc::Status ParameterServerService::Follow(grpc::ServerContext* context, const pb::ShardReport* request,
                                            pb::ShardView* response) {
  if (grpc::Status denied = Authorize(*context, "Follow"); !denied.ok()) return denied;
  const ServerOptions& o = core_->options();
  if (o.shards <= 1 || o.shard != 0) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
                             "this server is shard ", o.shard, " of ", o.shards,
                             ", not shard 0 of several: give --coordinator shard 0's address")));
  }
  if (request->shards() != o.shards || request->shard() <= 0 || request->shard() >= o.shards) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
                             "a report from shard ", request->shard(), " of ", request->shards(),
                             " reached shard 0 of ", o.shards, ": start every shard with the same --shards")));
  }
  shards_.Record(*request, context->peer(), absl::Now());
  Membership& members = core_->membership();
  auto answer = [&members, response](bool held) {
    response->set_view(members.view());
    response->set_incarnation(members.incarnation());
    response->clear_excluded_ranks();
    for (int r : members.ExcludedRanks()) response->add_excluded_ranks(r);
    response->set_job_error(members.job_error());
    response->set_held(held);
  };
  if (request->wait_ms() == 0 || request->view() != members.view() ||
      request->incarnation() != members.incarnation() || members.job_ended()) {
    answer(/*held=*/false);
    return grpc::Status::OK;
  }
  // The follower is at this view: hold its report until the view moves (or its wait ends), so
  // that it hears of an exclusion in one round trip rather than at its next report.
  const absl::Duration wait =
      std::clamp(absl::Milliseconds(request->wait_ms()), absl::Milliseconds(10), kMaxFollowWait);
  BlockedCall blocked;
  std::shared_ptr<Parked> held;
  {
    CallsToFinish released;  // finished after the lock is released
    absl::MutexLock lock(&held_mu_);
    // A held report counts against its peer's parked calls; past the limit it is answered at once.
    if (holding_ && held_ < kMaxHeldReports) {
      absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(PeerKey(-1, context->peer()), 1);
      if (parked.ok()) {
        held = std::make_shared<Parked>(&blocked, [answer](uint64_t, const Snapshot&) { answer(/*held=*/true); },
                                        Parked::WaitSpan{}, Parked::Holds{*std::move(parked), {}});
        held_reports_.Park(held, request->view() + 1, absl::InfiniteFuture());
        ++held_;
        // A view that moved after the check above, before the park, is answered here: its observer
        // may have run before the call was parked.
        held_reports_.Release(members.view(), NoSnapshot, released);
      }
    }
  }
  // Held: answered when the view moves, at the end of the wait (by this thread), or when the
  // server stops holding reports (its shutdown).
  if (held != nullptr) {
    const grpc::Status status = blocked.Wait(*context, *held, wait);
    absl::MutexLock lock(&held_mu_);
    --held_;
    return status;
  }
  answer(/*held=*/false);  // shutting down, or too many held: the next report comes after the interval
  return grpc::Status::OK;
}

void ParameterServerService::OnMembershipChange() {
  CallsToFinish released;
  absl::MutexLock lock(&held_mu_);
  held_reports_.Release(core_->membership().view(), NoSnapshot, released);
}

void ParameterServerService::StopHoldingReports() {
  CallsToFinish released;
  absl::MutexLock lock(&held_mu_);
  holding_ = false;
  held_reports_.ReleaseAll(0, NoSnapshot, released);
}

void ParameterServerService::ServePush(DataCall* call) {
  pb::PushRequest header;
  Scratch& values = RequestValues();
  absl::StatusOr<PushRequestView> view =
      ParsePush(*call, &header, &values, core_->options().tracer);
  if (!view.ok()) return Done(call, view.status());
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(PeerKey(view->rank, view->peer), view->data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  absl::StatusOr<bool> completed = core_->Push(*view);
  TrimRequestValues(values);
  if (completed.ok()) {
    pb::PushResponse reply;
    reply.set_completed_step(*completed);
    *call->response() = Encode(reply);
  }
  Done(call, completed.status());
}

void ParameterServerService::ServeInitialize(DataCall* call) {
  pb::InitializeRequest header;
  Scratch& values = RequestValues();
  constexpr int kDataPath[] = {pb::InitializeRequest::kDataFieldNumber};
  absl::string_view data;
  absl::Status parsed = ParseRequest(*call, kDataPath, &values, &data, &header);
  if (!parsed.ok()) return Done(call, parsed);
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
  TrimRequestValues(values);
  if (applied.ok()) {
    pb::InitializeResponse reply;
    reply.set_applied(*applied);
    *call->response() = Encode(reply);
  }
  return Done(call, applied.status());
}

void ParameterServerService::ServePull(DataCall* call) {
  pb::PullRequest r;
  absl::Status parsed = ParseWithBytes(call->request(), {}, nullptr, &r);
  if (!parsed.ok()) return Done(call, parsed);
  const std::optional<WireDType> dtype = WireDTypeFromProto(r.dtype(), /*unspecified_is_float32=*/true);
  if (!dtype.has_value()) {
    return Done(call, absl::InvalidArgumentError(absl::StrCat(
        "a pull's dtype must be DTYPE_FLOAT32 (or unset), DTYPE_BFLOAT16 or DTYPE_FLOAT16, not ",
        DTypeName(r.dtype()))));
  }
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(PeerKey(r.rank(), call->peer()), 1);
  if (!parked.ok()) return Done(call, parked.status());
  core_->Pull(r.rank(), r.session(), r.partition(), r.min_version(),
              PullCall(core_, call, r.partition(), *dtype, {*std::move(parked), {}}));
}

void ParameterServerService::ServePushPull(DataCall* call) {
  pb::PushRequest header;
  Scratch& values = RequestValues();
  absl::StatusOr<PushRequestView> view =
      ParsePush(*call, &header, &values, core_->options().tracer);
  if (!view.ok()) return Done(call, view.status());
  const std::string peer = PeerKey(view->rank, view->peer);
  absl::StatusOr<PeerBudget::Hold> bytes = in_flight_.Take(peer, view->data.size());
  if (!bytes.ok()) return Done(call, bytes.status());
  absl::StatusOr<PeerBudget::Hold> parked = parked_.Take(peer, 1);
  if (!parked.ok()) return Done(call, parked.status());
  // The reply comes in the dtype the push came in (a float32 push when the push's is unknown:
  // the push is refused, and the reply carries only that status).
  core_->PushPull(*view, PullCall(core_, call, header.partition(), view->dtype.value_or(WireDType::kFloat32),
                                  {*std::move(parked), {}}));
  TrimRequestValues(values);
}

void ParameterServerService::ServeAllReduce(DataCall* call) {
  pb::AllReduceRequest header;
  Scratch& values = RequestValues();
  constexpr int kDataPath[] = {pb::AllReduceRequest::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};
  absl::string_view data;
  absl::Status parsed = ParseRequest(*call, kDataPath, &values, &data, &header);
  if (!parsed.ok()) return Done(call, parsed);
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
      [response = call->response(), spec = *spec](uint64_t round, const Snapshot& sum) {
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
  TrimRequestValues(values);
}

grpc::Status ParameterServerService::DataPlane(grpc::ServerContext* context, const pb::DataPlaneRequest*,
                                               pb::DataPlaneResponse* response) {
  if (grpc::Status denied = Authorize(*context, "DataPlane"); !denied.ok()) return denied;
  response->set_port(data_plane_port_.load(std::memory_order_relaxed));
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::GetStatus(grpc::ServerContext* context, const pb::GetStatusRequest* request,
                                               pb::ServerStatus* response) {
  if (grpc::Status denied = Authorize(*context, "GetStatus"); !denied.ok()) return denied;
  const StatusSnapshot s = core_->Status();
  const ServerOptions& o = core_->options();
  const absl::Time now = o.clock->Now();
  response->set_version(s.version);
  response->set_mode(ModeToProto(o.mode));
  response->set_world_size(o.world_size);
  for (const MemberInfo& m : s.members) {
    pb::MemberStatus* out = response->add_members();
    out->set_rank(m.rank);
    out->set_state(MemberStateName(m.state));
    out->set_lease_left_seconds(absl::ToDoubleSeconds(m.lease_expiry - now));
    out->set_joins(m.joins);
    out->set_peer(m.peer);
    out->set_status_address(m.status_address);
    out->set_pushes(m.pushes);
    out->set_examples(m.examples);
    out->set_last_seen_seconds_ago(absl::ToDoubleSeconds(now - m.last_seen));
  }
  response->set_model_defined(s.model_defined);
  response->set_partitions_pending(s.partitions_pending);
  response->set_parameter_count(s.parameter_count);
  response->set_parameter_bytes(s.parameter_count * 4);
  response->set_partition_count(s.partition_count);
  response->set_partition_bytes(o.partition_bytes);
  response->set_bytes_in(s.bytes_in);
  response->set_bytes_out(s.bytes_out);
  response->set_pushes_served(s.pushes_served);
  response->set_pulls_served(s.pulls_served);
  response->set_allreduce_rounds(hub_->rounds_completed());
  response->set_last_step_seconds(absl::ToDoubleSeconds(s.last_step));
  response->set_uptime_seconds(absl::ToDoubleSeconds(s.uptime));
  response->set_optimizer(s.optimizer);
  for (const TensorSpec& spec : s.params) SpecToProto(spec, response->add_params());
  response->set_staleness(o.staleness);
  response->set_on_worker_loss(OnWorkerLossName(o.on_worker_loss));
  response->set_nonfinite(NonFiniteName(o.nonfinite));
  response->set_nonfinite_pushes(s.nonfinite_pushes);
  response->set_learning_rate(s.learning_rate);
  response->set_lease_seconds(absl::ToDoubleSeconds(o.lease));
  response->set_duplicate_pushes(s.duplicate_pushes);
  response->set_stale_view_pushes(s.stale_view_pushes);
  response->set_last_checkpoint_path(s.checkpoint.path);
  response->set_last_checkpoint_version(s.checkpoint.version);
  response->set_last_checkpoint_age_seconds(
      s.checkpoint.written == absl::InfinitePast() ? -1 : absl::ToDoubleSeconds(now - s.checkpoint.written));
  response->set_job_error(s.job_error);
  response->set_parked_calls(parked_.total());
  response->set_allreduce_collectives(hub_->collectives());
  response->set_allreduce_buffer_bytes(hub_->buffer_bytes());
  response->set_wire_dtype(std::string(WireDTypeName(o.wire_dtype)));
  response->set_compress(CompressionName(o.compression));
  response->set_shard(o.shard);
  response->set_shards(o.shards);
  response->set_rollbacks(s.rollbacks);
  response->set_last_rollback_version(s.last_rollback_version);
  response->set_view(s.view);
  if (o.shards > 1 && o.shard == 0) {
    for (pb::ShardStatus& shard : shards_.Statuses(ReportOf(*core_, s), absl::Now())) {
      *response->add_shard_statuses() = std::move(shard);
    }
  }
  return grpc::Status::OK;
}

}  // namespace summa::server
