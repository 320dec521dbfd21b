#include "server/rpc/coordination.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>

#include "common/rpc/grpc_status.h"
#include "common/logging.h"
#include "common/rpc/server_builder.h"

namespace summa::server {

namespace pb = summa::v1;

pb::ShardReport ReportOf(const ParameterServer& core) { return ReportOf(core, core.Status()); }

pb::ShardReport ReportOf(const ParameterServer& core, const StatusSnapshot& s) {
  const ServerOptions& o = core.options();
  pb::ShardReport r;
  r.set_shard(o.shard);
  r.set_shards(o.shards);
  r.set_version(s.version);
  r.set_partition_count(s.partition_count);
  r.set_partition_bytes_held(s.partition_bytes_held);
  r.set_bytes_in(s.bytes_in);
  r.set_bytes_out(s.bytes_out);
  r.set_last_checkpoint_version(s.checkpoint.version);
  r.set_view(s.view);
  r.set_job_error(s.job_error);
  r.set_incarnation(core.membership().followed_incarnation());
  return r;
}

void ShardBoard::Record(const pb::ShardReport& report, const std::string& peer, absl::Time now) {
  absl::MutexLock lock(&mu_);
  shards_[report.shard()] = {report, peer, now};
}

namespace {

pb::ShardStatus StatusOf(const pb::ShardReport& r, const std::string& peer, absl::Duration age) {
  pb::ShardStatus s;
  s.set_shard(r.shard());
  s.set_peer(peer);
  s.set_healthy(age <= kShardHealthyWithin && r.job_error().empty());
  s.set_last_report_age_seconds(absl::ToDoubleSeconds(age));
  s.set_version(r.version());
  s.set_partition_count(r.partition_count());
  s.set_partition_bytes_held(r.partition_bytes_held());
  s.set_bytes_in(r.bytes_in());
  s.set_bytes_out(r.bytes_out());
  s.set_last_checkpoint_version(r.last_checkpoint_version());
  s.set_view(r.view());
  s.set_job_error(r.job_error());
  return s;
}

}  // namespace

std::vector<pb::ShardStatus> ShardBoard::Statuses(const pb::ShardReport& self, absl::Time now) const {
  std::vector<pb::ShardStatus> out = {StatusOf(self, "self", absl::ZeroDuration())};
  absl::MutexLock lock(&mu_);
  for (const auto& [shard, e] : shards_) out.push_back(StatusOf(e.report, e.peer, now - e.at));
  return out;
}

ShardFollower::ShardFollower(const std::string& coordinator, const ClientSecurity& security,
                             ParameterServer* core, absl::Duration interval, absl::Duration give_up)
    : coordinator_(coordinator),
      token_(security.token),
      core_(core),
      interval_(interval),
      give_up_(give_up > absl::ZeroDuration() ? give_up : std::max(absl::Seconds(10), 3 * core->options().lease)) {
  stub_ = pb::ParameterServer::NewStub(
      grpc::CreateCustomChannel(coordinator_, ChannelCredentialsFor(security.tls), DefaultChannelArguments()));
  thread_ = std::thread([this] { Loop(); });
}

ShardFollower::~ShardFollower() {
  stop_.Notify();
  {
    absl::MutexLock lock(&call_mu_);
    if (call_ != nullptr) call_->TryCancel();
  }
  thread_.join();
}

void ShardFollower::Loop() {
  Membership& members = core_->membership();
  absl::Time failing_since = absl::InfiniteFuture(), last_warning = absl::InfinitePast();
  absl::Duration pause = absl::ZeroDuration();  // before the next report
  while (!stop_.WaitForNotificationWithTimeout(pause)) {
    pause = interval_;
    pb::ShardView view;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + interval_ + absl::Seconds(2)));
    AttachToken(token_.Current(), &ctx);
    pb::ShardReport report = ReportOf(*core_);
    report.set_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(interval_), 1, INT32_MAX)));
    {
      absl::MutexLock lock(&call_mu_);
      if (stop_.HasBeenNotified()) return;
      call_ = &ctx;
    }
    const absl::Status s = FromGrpcStatus(stub_->Follow(&ctx, report, &view));
    {
      absl::MutexLock lock(&call_mu_);
      call_ = nullptr;
    }
    if (stop_.HasBeenNotified()) return;  // cancelled by the destructor
    const absl::Time now = absl::Now();
    if (s.ok()) {
      if (failing_since != absl::InfiniteFuture()) {
        SUMMA_LOG(INFO) << "reaching shard 0 at " << coordinator_ << " again, at view " << view.view()
                        << (members.follower() ? "" : "; following its view again");
      }
      failing_since = absl::InfiniteFuture();
      members.set_follower(true);
      members.Follow(view.incarnation(), view.view(), {view.excluded_ranks().begin(), view.excluded_ranks().end()},
                     view.job_error());
      // Report again at once when shard 0 held the report while the view stood, or when this
      // answer brought a view (or shard 0 process) the report did not have: the next report has
      // it and is held. An answer this shard does not take (its own view went past shard 0's
      // while it decided alone) waits for the interval: no busy loop.
      const bool learned = members.view() == view.view() &&
                           (report.view() != view.view() || report.incarnation() != view.incarnation());
      if (view.held() || learned) pause = absl::ZeroDuration();
      continue;
    }
    if (failing_since == absl::InfiniteFuture()) failing_since = now;
    if (members.follower() && now - failing_since >= give_up_) {
      // A shard 0 gone for good must not stall the job: leases decide here until it is back.
      members.set_follower(false);
      SUMMA_LOG(ERROR) << "no report reached shard 0 at " << coordinator_ << " for "
                       << absl::FormatDuration(give_up_) << ": this shard decides by its own leases until it does";
    }
    if (now - last_warning >= absl::Seconds(10)) {
      last_warning = now;
      SUMMA_LOG(WARNING) << "cannot report to shard 0 at " << coordinator_ << " (for "
                         << absl::FormatDuration(absl::Trunc(now - failing_since, absl::Seconds(1)))
                         << "): " << s.message() << "; this shard keeps shard 0's view " << members.view();
    }
  }
}

}  // namespace summa::server
