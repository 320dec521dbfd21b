#include "server/service.h"

#include <atomic>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tensor_proto.h"
#include "common/logging.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;

// A unary reactor that a ParkedCall can answer later. The claim flag decides between the core
// answering and the client cancelling; only the winner touches the response and calls Finish.
class ParkedReactor final : public grpc::ServerUnaryReactor {
 public:
  using FillFn = std::function<void(uint64_t, absl::Span<const float>)>;

  class Call final : public ParkedCall {
   public:
    Call(ParkedReactor* reactor, FillFn fill) : reactor_(reactor), fill_(std::move(fill)) {}
    bool Claim() override { return !claimed_.exchange(true); }
    void Fill(uint64_t counter, absl::Span<const float> values) override { fill_(counter, values); }
    void Finish(absl::Status status) override { reactor_->Finish(ToGrpcStatus(status)); }

   private:
    std::atomic<bool> claimed_{false};
    ParkedReactor* const reactor_;  // Not owned; alive until Finish has been called.
    const FillFn fill_;
  };

  explicit ParkedReactor(FillFn fill) : call_(std::make_shared<Call>(this, std::move(fill))) {}
  std::shared_ptr<Call> call() const { return call_; }

  void OnCancel() override {
    if (call_->Claim()) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<Call> call_;
};

PushRequestView PushView(grpc::CallbackServerContext* context, const pb::PushRequest& r) {
  PushRequestView v;
  v.rank = r.rank();
  v.step = r.step();
  v.partition = r.partition();
  v.num_examples = r.num_examples();
  v.dtype_is_float32 = r.dtype() == pb::DTYPE_FLOAT32;
  v.data = r.data();
  v.peer = context->peer();
  return v;
}

// Fill runs under the partition's lock: the live ranks sent are those the step was answered
// under (an exclusion completes steps under the same lock).
ParkedReactor* PullReactor(const ParameterServer* core, pb::PullResponse* response, uint32_t partition) {
  return new ParkedReactor([core, response, partition](uint64_t version, absl::Span<const float> w) {
    response->set_partition(partition);
    response->set_version(version);
    response->set_dtype(pb::DTYPE_FLOAT32);
    response->mutable_data()->assign(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    response->clear_live_ranks();
    for (int r : core->LiveRanks()) response->add_live_ranks(r);
  });
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* ParameterServerService::Join(grpc::CallbackServerContext* context,
                                                       const pb::JoinRequest* request,
                                                       pb::JoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  JoinRequestView view;
  view.rank = request->rank();
  view.world_size = request->world_size();
  view.peer = context->peer();
  view.status_address = request->status_address();
  for (const pb::Tensor& t : request->params()) {
    absl::StatusOr<TensorSpec> spec = SpecFromProto(t);
    if (!spec.ok()) {
      reactor->Finish(ToGrpcStatus(spec.status()));
      return reactor;
    }
    view.params.push_back({*std::move(spec), t.data()});
  }
  absl::StatusOr<JoinResult> joined = core_->Join(view);
  if (!joined.ok()) {
    reactor->Finish(ToGrpcStatus(joined.status()));
    return reactor;
  }
  response->set_rank(joined->rank);
  response->set_world_size(core_->options().world_size);
  response->set_mode(ModeToProto(core_->options().mode));
  response->set_version(joined->version);
  response->set_next_step(joined->next_step);
  response->set_partition_bytes(core_->options().partition_bytes);
  response->set_lease_seconds(absl::ToDoubleSeconds(core_->options().lease));
  response->set_staleness(core_->options().staleness);
  for (int r : joined->live_ranks) response->add_live_ranks(r);
  for (const PartitionRange& p : joined->partitions) {
    pb::Partition* out = response->add_partitions();
    out->set_id(p.id);
    out->set_offset(p.offset);
    out->set_length(p.length);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const pb::HeartbeatRequest* request,
                                                            pb::HeartbeatResponse* response) {
  absl::Status s = core_->Heartbeat(request->rank());
  if (s.ok()) response->set_version(core_->Status().version);
  return Done(context, s);
}

grpc::ServerUnaryReactor* ParameterServerService::Leave(grpc::CallbackServerContext* context,
                                                        const pb::LeaveRequest* request,
                                                        pb::LeaveResponse* response) {
  return Done(context, core_->Leave(request->rank()));
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(grpc::CallbackServerContext* context,
                                                             const pb::CheckpointRequest* request,
                                                             pb::CheckpointResponse* response) {
  if (core_->options().checkpoint_dir.empty()) {
    return Done(context, absl::FailedPreconditionError(
                             "no --checkpoint_dir: this server does not write checkpoints"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  background_([core = core_, reactor, response] {
    absl::Status s = core->MaybeCheckpoint(/*force=*/true);
    if (s.ok()) {
      const StatusSnapshot status = core->Status();
      response->set_path(status.checkpoint.path);
      response->set_version(status.checkpoint.version);
    }
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(grpc::CallbackServerContext* context,
                                                       const pb::PushRequest* request,
                                                       pb::PushResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<bool> completed = core_->Push(PushView(context, *request));
  if (completed.ok()) response->set_completed_step(*completed);
  reactor->Finish(ToGrpcStatus(completed.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const pb::PullRequest* request,
                                                       pb::PullResponse* response) {
  ParkedReactor* reactor = PullReactor(core_, response, request->partition());
  core_->Pull(request->rank(), request->partition(), request->min_version(), reactor->call());
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(grpc::CallbackServerContext* context,
                                                           const pb::PushRequest* request,
                                                           pb::PullResponse* response) {
  ParkedReactor* reactor = PullReactor(core_, response, request->partition());
  core_->PushPull(PushView(context, *request), reactor->call());
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::AllReduce(grpc::CallbackServerContext* context,
                                                            const pb::AllReduceRequest* request,
                                                            pb::AllReduceResponse* response) {
  absl::StatusOr<TensorSpec> spec = SpecFromProto(request->tensor());
  if (!spec.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(spec.status()));
    return reactor;
  }
  ParkedReactor* reactor =
      new ParkedReactor([response, spec = *spec](uint64_t round, absl::Span<const float> sum) {
        SpecToProto(spec, response->mutable_tensor());
        response->mutable_tensor()->mutable_data()->assign(reinterpret_cast<const char*>(sum.data()),
                                                           sum.size() * 4);
        response->set_round(round - 1);
      });
  AllReduceContribution c;
  c.name = request->name();
  c.group_size = request->group_size();
  c.rank = request->rank();
  c.members = request->members();
  c.round = request->round();
  c.spec = *std::move(spec);
  c.data = request->tensor().data();
  hub_->Contribute(c, reactor->call());
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::GetStatus(grpc::CallbackServerContext* context,
                                                            const pb::GetStatusRequest* request,
                                                            pb::ServerStatus* response) {
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
  response->set_last_checkpoint_path(s.checkpoint.path);
  response->set_last_checkpoint_version(s.checkpoint.version);
  response->set_last_checkpoint_age_seconds(
      s.checkpoint.written == absl::InfinitePast() ? -1 : absl::ToDoubleSeconds(now - s.checkpoint.written));
  response->set_job_error(s.job_error);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace summa::server
