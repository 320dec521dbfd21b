#include "server/service.h"

#include <atomic>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "server/checkpoint.h"

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

absl::StatusOr<TensorSpec> SpecFrom(const pb::Tensor& t) {
  if (t.dtype() != pb::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dtype ",
                                                   pb::DType_Name(t.dtype()),
                                                   "; only DTYPE_FLOAT32 is supported"));
  }
  TensorSpec spec;
  spec.name = t.name();
  spec.shape.assign(t.shape().begin(), t.shape().end());
  return spec;
}

void ToProto(const TensorSpec& spec, pb::Tensor* out) {
  out->set_name(spec.name);
  out->set_dtype(pb::DTYPE_FLOAT32);
  for (int64_t d : spec.shape) out->add_shape(d);
}

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

// Fill runs under the partition's lock, where the live set is stable.
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

pb::Mode ToProto(Mode mode) {
  switch (mode) {
    case Mode::kSync: return pb::MODE_SYNC;
    case Mode::kAsync: return pb::MODE_ASYNC;
    case Mode::kSsp: return pb::MODE_SSP;
  }
  return pb::MODE_UNSPECIFIED;
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
    absl::StatusOr<TensorSpec> spec = SpecFrom(t);
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
  response->set_mode(ToProto(core_->options().mode));
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
  absl::Status s = core_->Heartbeat(request->rank(), context->peer());
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
  absl::Status s = core_->MaybeCheckpoint(/*force=*/true);
  if (s.ok()) {
    const StatusSnapshot status = core_->Status();
    response->set_path(status.checkpoint.path);
    response->set_version(status.checkpoint.version);
  }
  return Done(context, s);
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
  core_->Pull(request->rank(), request->partition(), request->min_version(), context->peer(),
              reactor->call());
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
  absl::StatusOr<TensorSpec> spec = SpecFrom(request->tensor());
  if (!spec.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(spec.status()));
    return reactor;
  }
  ParkedReactor* reactor =
      new ParkedReactor([response, spec = *spec](uint64_t round, absl::Span<const float> sum) {
        ToProto(spec, response->mutable_tensor());
        response->mutable_tensor()->mutable_data()->assign(reinterpret_cast<const char*>(sum.data()),
                                                           sum.size() * 4);
        response->set_round(round - 1);
      });
  AllReduceContribution c;
  c.name = request->name();
  c.group_size = request->group_size();
  c.rank = request->rank();
  c.spec = *std::move(spec);
  c.data = request->tensor().data();
  hub_->Contribute(c, reactor->call());
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::GetStatus(grpc::CallbackServerContext* context,
                                                            const pb::GetStatusRequest* request,
                                                            pb::ServerStatus* response) {
  const StatusSnapshot s = core_->Status();
  const absl::Time now = absl::Now();
  response->set_version(s.version);
  response->set_mode(ToProto(s.mode));
  response->set_world_size(s.world_size);
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
  response->set_partition_bytes(s.partition_bytes);
  response->set_bytes_in(s.bytes_in);
  response->set_bytes_out(s.bytes_out);
  response->set_pushes_served(s.pushes_served);
  response->set_pulls_served(s.pulls_served);
  response->set_allreduce_rounds(hub_->rounds_completed());
  response->set_last_step_seconds(absl::ToDoubleSeconds(s.last_step));
  response->set_uptime_seconds(absl::ToDoubleSeconds(s.uptime));
  response->set_optimizer(s.optimizer);
  for (const TensorSpec& spec : s.params) ToProto(spec, response->add_params());
  const ServerOptions& o = core_->options();
  response->set_staleness(o.staleness);
  response->set_on_worker_loss(o.on_worker_loss == OnWorkerLoss::kShrink ? "shrink" : "wait");
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

SummaServer::SummaServer(ServerOptions options)
    : core_(options), hub_(options.barrier_deadline), service_(&core_, &hub_) {}

absl::StatusOr<std::unique_ptr<SummaServer>> SummaServer::Start(const std::string& address,
                                                                ServerOptions options,
                                                                const std::string& metrics_address) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  std::unique_ptr<MetricsEndpoint> metrics;
  Metrics m{};
  if (!metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> started = MetricsEndpoint::Start(metrics_address);
    if (!started.ok()) return started.status();
    metrics = *std::move(started);
    MetricsEndpoint& e = *metrics;
    m.steps = &e.Counter("summa_server_steps_total", "Steps completed (pushes applied in async and ssp modes)");
    m.pushes = &e.Counter("summa_server_pushes_total", "Partition pushes served");
    m.pulls = &e.Counter("summa_server_pulls_total", "Partition pulls answered");
    m.duplicates = &e.Counter("summa_server_duplicate_pushes_total", "Retried pushes recognised and not summed again");
    m.bytes_in = &e.Counter("summa_server_received_bytes_total", "Gradient bytes received");
    m.bytes_out = &e.Counter("summa_server_sent_bytes_total", "Weight bytes sent");
    m.allreduce_rounds = &e.Counter("summa_server_allreduce_rounds_total", "AllReduce rounds completed");
    m.version = &e.Gauge("summa_server_version", "Steps completed: the lowest partition version");
    m.members_alive = &e.Gauge("summa_server_members_alive", "Members whose lease is current");
    m.checkpoint_age = &e.Gauge("summa_server_checkpoint_age_seconds", "Age of the last checkpoint (-1: none)");
    m.step_seconds = &e.StepHistogram("summa_server_step_seconds", "Time between consecutive step completions");
    prometheus::Histogram* histogram = m.step_seconds;
    options.step_observer = [histogram](absl::Duration d) { histogram->Observe(absl::ToDoubleSeconds(d)); };
  }
  std::unique_ptr<SummaServer> server(new SummaServer(options));
  server->metrics_ = std::move(metrics);
  server->m_ = m;
  if (!options.checkpoint_dir.empty()) {
    std::vector<std::string> warnings;
    std::optional<RestoredCheckpoint> restored = LoadNewestCheckpoint(options.checkpoint_dir, &warnings);
    for (const std::string& w : warnings) SUMMA_LOG(WARNING) << w;
    if (restored.has_value()) {
      absl::Status s = server->core_.Restore(restored->checkpoint);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("cannot restore ", restored->path, ": ", s.message()));
      }
      SUMMA_LOG(INFO) << "restored " << restored->path << " at version " << restored->checkpoint.version();
    }
  }
  absl::StatusOr<RunningServer> running =
      StartGrpcServer(address, {&server->service_}, {"summa.v1.ParameterServer"});
  if (!running.ok()) return running.status();
  server->running_ = *std::move(running);
  server->ticker_ = std::thread([s = server.get()] { s->TickLoop(); });
  return server;
}

void SummaServer::TickLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
    if (stop_) break;
    mu_.Unlock();
    const absl::Time now = absl::Now();
    core_.Tick(now);
    hub_.ExpireRounds(now);
    if (metrics_) UpdateMetrics();
    absl::Status checkpoint = core_.MaybeCheckpoint(/*force=*/false);
    if (!checkpoint.ok() && !absl::IsFailedPrecondition(checkpoint)) {
      SUMMA_LOG(ERROR) << "checkpoint failed: " << checkpoint.message();
    }
    std::string error = core_.job_error();
    mu_.Lock();
    if (!error.empty()) job_error_ = error;
  }
}

void SummaServer::UpdateMetrics() {
  const StatusSnapshot s = core_.Status();
  AdvanceCounter(*m_.steps, static_cast<double>(s.version));
  AdvanceCounter(*m_.pushes, static_cast<double>(s.pushes_served));
  AdvanceCounter(*m_.pulls, static_cast<double>(s.pulls_served));
  AdvanceCounter(*m_.duplicates, static_cast<double>(s.duplicate_pushes));
  AdvanceCounter(*m_.bytes_in, static_cast<double>(s.bytes_in));
  AdvanceCounter(*m_.bytes_out, static_cast<double>(s.bytes_out));
  AdvanceCounter(*m_.allreduce_rounds, static_cast<double>(hub_.rounds_completed()));
  m_.version->Set(static_cast<double>(s.version));
  int alive = 0;
  for (const MemberInfo& member : s.members) alive += member.state == MemberState::kAlive;
  m_.members_alive->Set(alive);
  m_.checkpoint_age->Set(s.checkpoint.written == absl::InfinitePast()
                             ? -1
                             : absl::ToDoubleSeconds(absl::Now() - s.checkpoint.written));
}

std::string SummaServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](SummaServer* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->shut_down_ || !s->job_error_.empty();
      },
      this));
  return job_error_;
}

void SummaServer::Shutdown() {
  absl::MutexLock shutdown(&shutdown_mu_);
  if (shutdown_done_) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  if (running_.health) running_.health->SetServing(false);
  // The last checkpoint: retried briefly, since partitions may be between versions of a step.
  if (!core_.options().checkpoint_dir.empty()) {
    absl::Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      s = core_.MaybeCheckpoint(/*force=*/true);
      if (!absl::IsFailedPrecondition(s)) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!s.ok()) SUMMA_LOG(ERROR) << "final checkpoint failed: " << s.message();
  }
  core_.Shutdown();
  hub_.Shutdown();
  if (running_.server) running_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  shutdown_done_ = true;
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

SummaServer::~SummaServer() { Shutdown(); }

}  // namespace summa::server
