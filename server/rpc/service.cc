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

}  // namespace

absl::StatusOr<ExportedModel> ExportWhenOneVersion(ParameterServer& core, const std::string& dir,
                                                   const std::string& file_name) {
  absl::StatusOr<ExportedModel> exported;
  for (int attempt = 0; attempt < 100; ++attempt) {
    exported = core.Export(dir, file_name);
    if (!absl::IsUnavailable(exported.status())) break;
    absl::SleepFor(absl::Milliseconds(20));  // real time: the workers' pushes are in flight
  }
  return exported;
}

grpc::Status ParameterServerService::Authorize(const grpc::ServerContextBase& context, std::string_view method,
                                               int rank, int* acting) const {
  absl::StatusOr<Caller> caller = tokens_->Identify(context, RequiredRole(method));
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<int> as = ActingRank(*caller, method, rank);
  if (!as.ok()) return ToGrpcStatus(as.status());
  if (acting != nullptr) *acting = *as;
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Join(grpc::ServerContext* context, const pb::JoinRequest* request,
                                          pb::JoinResponse* response) {
  JoinRequestView view;
  // A rank-scoped token's Join for rank -1 is one for its own rank.
  if (grpc::Status denied = Authorize(*context, "Join", request->rank(), &view.rank); !denied.ok()) return denied;
  if (absl::Status rate = joins_.Take(); !rate.ok()) return ToGrpcStatus(rate);
  view.world_size = request->world_size();
  view.peer = context->peer();
  view.status_address = request->status_address();
  view.values_follow = request->values_follow();
  view.takes_local_steps = request->takes_local_steps();
  view.tables.assign(request->tables().begin(), request->tables().end());
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
  response->set_backup_workers(core_->options().backup_workers);
  response->set_sync_every(core_->options().sync_every);
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
  if (grpc::Status denied = Authorize(*context, "Heartbeat", request->rank()); !denied.ok()) return denied;
  absl::Status s = core_->Heartbeat(request->rank(), request->session());
  if (s.ok()) {
    response->set_version(core_->version());
    response->set_view(core_->view());
  }
  return ToGrpcStatus(s);
}

grpc::Status ParameterServerService::Leave(grpc::ServerContext* context, const pb::LeaveRequest* request,
                                           pb::LeaveResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Leave", request->rank()); !denied.ok()) return denied;
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

grpc::Status ParameterServerService::Export(grpc::ServerContext* context, const pb::ExportRequest* request,
                                            pb::ExportResponse* response) {
  if (grpc::Status denied = Authorize(*context, "Export"); !denied.ok()) return denied;
  absl::StatusOr<ExportedModel> exported;
  OnDaemonThread([&] { exported = ExportWhenOneVersion(*core_, core_->export_dir(), request->file_name()); });
  if (exported.ok()) {
    response->set_path(exported->path);
    response->set_version(exported->version);
    response->set_tensors(exported->tensors);
    response->set_bytes(static_cast<int64_t>(exported->bytes));
  }
  return ToGrpcStatus(exported.status());
}

grpc::Status ParameterServerService::RollBack(grpc::ServerContext* context, const pb::RollBackRequest* request,
                                              pb::RollBackResponse* response) {
  if (grpc::Status denied = Authorize(*context, "RollBack", request->rank()); !denied.ok()) return denied;
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

grpc::Status ParameterServerService::DataPlane(grpc::ServerContext* context, const pb::DataPlaneRequest*,
                                               pb::DataPlaneResponse* response) {
  if (grpc::Status denied = Authorize(*context, "DataPlane"); !denied.ok()) return denied;
  response->set_port(data_plane_port_.load(std::memory_order_acquire));
  response->set_tls(data_plane_tls_.load(std::memory_order_relaxed));
  if (!shm_socket_.empty()) {
    response->set_shm_socket(shm_socket_);
    response->set_shm_instance(shm_instance_);
  }
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
    out->set_from_step(m.from_step);
    out->set_last_seen_seconds_ago(absl::ToDoubleSeconds(now - m.last_seen));
    if (m.rank >= 0 && m.rank < static_cast<int>(s.lateness.size())) {
      const RankLateness& l = s.lateness[m.rank];
      out->set_late_pushes(l.late_pushes);
      out->set_mean_push_delay_seconds(absl::ToDoubleSeconds(l.mean_delay()));
      out->set_last_push_delay_seconds(absl::ToDoubleSeconds(l.last_delay));
      out->set_steps_behind(l.steps_behind);
    }
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
  response->set_min_workers(o.min_workers > 0 ? o.min_workers : o.world_size);
  for (const GroupChange& change : s.group_log) {
    pb::GroupChange* out = response->add_group_changes();
    out->set_from_step(change.from_step);
    out->set_view(change.group.view);
    for (int r : change.group.ranks) out->add_ranks(r);
  }
  response->set_steps_restarted(s.steps_restarted);
  response->set_examples_applied(s.examples_applied);
  response->set_backup_workers(o.backup_workers);
  response->set_sync_every(o.sync_every);
  response->set_late_pushes(s.late_pushes);
  for (const TableCounters& t : s.tables) {
    pb::TableStatus* out = response->add_tables();
    out->set_name(t.name);
    out->set_dim(t.dim);
    out->set_optimizer(t.optimizer);
    out->set_version(t.version);
    out->set_rows(t.rows);
    out->set_bytes(t.bytes);
    out->set_rows_created(t.rows_created);
    out->set_rows_expired(t.rows_expired);
    out->set_rows_waiting_admission(t.rows_waiting_admission);
    out->set_unadmitted_reads(t.unadmitted_reads);
    out->set_dropped_gradients(t.dropped_gradients);
    out->set_rows_pulled(t.rows_pulled);
    out->set_rows_pushed(t.rows_pushed);
  }
  response->set_table_bytes(s.table_bytes);
  response->set_max_table_bytes(s.max_table_bytes);
  response->set_joins_refused(joins_.refused());
  response->set_request_buffer_bytes(request_buffer_bytes());
  if (o.shards > 1 && o.shard == 0) {
    for (pb::ShardStatus& shard : shards_.Statuses(ReportOf(*core_, s), absl::Now())) {
      *response->add_shard_statuses() = std::move(shard);
    }
  }
  return grpc::Status::OK;
}

}  // namespace summa::server
