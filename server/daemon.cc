#include "server/daemon.h"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"

namespace summa::server {

namespace {
// The data path's threads: one per core, from two to sixteen (they sum partitions in parallel;
// their polling also reads the control plane's calls, which gRPC's synchronous threads run).
// Two rather than one on a 2-core VM: the same times within this VM's noise, and summa-server's
// peak RSS in a 64 MiB two-rank AllReduce 243-261 MiB against 290-298 MiB with one (the ranks'
// chunks wait, received, for the one thread).
int DataPathThreads() { return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 16); }
}  // namespace

SummaServer::SummaServer(ServerOptions options, TokenCheck tokens)
    : core_(options),
      hub_(options.barrier_deadline, options.clock, &core_.membership(), options.limits),
      tokens_(std::move(tokens)),
      service_(&core_, &hub_, [this](std::function<void()> task) { RunInBackground(std::move(task)); },
               &tokens_) {
  core_.membership().AddObserver([this] { hub_.OnMembershipChange(); });
  core_.membership().AddObserver([this] { service_.OnMembershipChange(); });
  // The tick thread writes it at once: the next multiple of --checkpoint_every may come soon.
  core_.OnCheckpointDue([this] { RunInBackground([] {}); });
}

absl::StatusOr<std::unique_ptr<SummaServer>> SummaServer::Start(const std::string& address,
                                                                ServerOptions options,
                                                                const std::string& metrics_address,
                                                                EndpointSecurity security,
                                                                const std::string& health_address,
                                                                Coordinator coordinator,
                                                                const std::string& data_address,
                                                                const std::string& shm_socket) {
  if (absl::Status tls = ValidateTls(security.tls, /*server=*/true); !tls.ok()) return tls;
  // Published snapshot buffers are memfds (server/core/snapshot.h), a descriptor each, besides
  // the connections': as many as the hard limit allows.
  if (rlimit files; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  options.follower = !coordinator.address.empty() && options.shard > 0;
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
    m.nonfinite = &e.Counter("summa_server_nonfinite_pushes_total", "Pushes holding NaN or infinity (handled by --nonfinite)");
    m.bytes_in = &e.Counter("summa_server_received_bytes_total", "Gradient bytes received");
    m.bytes_out = &e.Counter("summa_server_sent_bytes_total", "Weight bytes sent");
    m.allreduce_rounds = &e.Counter("summa_server_allreduce_rounds_total", "AllReduce rounds completed");
    m.version = &e.Gauge("summa_server_version", "Steps completed: the lowest partition version");
    m.members_alive = &e.Gauge("summa_server_members_alive", "Members whose lease is current");
    m.checkpoint_age = &e.Gauge("summa_server_checkpoint_age_seconds", "Age of the last checkpoint (-1: none)");
    m.learning_rate = &e.Gauge("summa_server_learning_rate", "The schedule's learning rate for the next update");
    m.late_pushes = &e.Counter("summa_server_late_pushes_total",
                               "Partition pushes dropped for coming after their step completed (--backup_workers)");
    m.member_late_pushes = &e.CounterFamily(
        "summa_server_member_late_pushes_total",
        "A member's partition pushes dropped for coming after their step completed (--backup_workers), by rank");
    m.member_push_delay = &e.GaugeFamily(
        "summa_server_member_push_delay_seconds",
        "Mean delay from a step's first push to a member's push of it (--backup_workers), by rank");
    m.member_last_push_delay = &e.GaugeFamily(
        "summa_server_member_last_push_delay_seconds",
        "Delay from its step's first push to a member's last push (--backup_workers), by rank");
    m.member_steps_behind = &e.GaugeFamily(
        "summa_server_member_steps_behind",
        "Steps completed past the step of a member's last push when it came (0: on time; --backup_workers), by rank");
    m.table_bytes = &e.Gauge("summa_server_table_bytes",
                             "Bytes this shard's embedding tables hold (rows, their optimizer state, index; "
                             "bounded by --max_table_bytes)");
    m.table_rows = &e.GaugeFamily("summa_server_table_rows", "Rows of an embedding table held here, by table");
    m.table_rows_waiting = &e.GaugeFamily("summa_server_table_rows_waiting_admission",
                                          "Ids seen and not yet admitted (admit_after), by table");
    m.table_rows_created = &e.CounterFamily("summa_server_table_rows_created_total",
                                            "Rows created (first pull, or admission), by table");
    m.table_rows_expired = &e.CounterFamily("summa_server_table_rows_expired_total",
                                            "Rows dropped untouched for expire_after steps, by table");
    m.table_rows_pulled = &e.CounterFamily("summa_server_table_rows_pulled_total", "Rows answered to pulls, by table");
    m.table_rows_pushed = &e.CounterFamily("summa_server_table_rows_pushed_total", "Row gradients pushed, by table");
    m.table_dropped_gradients = &e.CounterFamily(
        "summa_server_table_dropped_gradients_total",
        "Pushed row gradients dropped: their rows not admitted yet, or expired since, by table");
    m.plane_connections = &e.Gauge("summa_server_data_plane_connections", "Socket data plane connections open");
    m.plane_hellos = &e.Counter("summa_server_data_plane_hellos_total",
                                "Socket data plane connections whose hello (token) passed");
    m.plane_hellos_failed = &e.Counter(
        "summa_server_data_plane_failed_hellos_total",
        "Socket data plane connections whose hello failed: timed out (--data_plane_hello_timeout), not a hello, or "
        "a token refused");
    m.plane_hello_evictions = &e.Counter(
        "summa_server_data_plane_hello_evictions_total",
        "Socket data plane connections closed in their hello to make room for a newer one "
        "(--max_data_plane_connections_in_hello, --max_data_plane_connections_in_hello_per_source)");
    m.shm_connections = &e.Gauge("summa_server_shm_plane_connections", "Shared-memory plane connections open");
    m.shm_requests = &e.Counter("summa_server_shm_plane_requests_total",
                                "Shared-memory plane requests read in place from a worker's segment");
    m.shm_values = &e.Counter("summa_server_shm_plane_values_in_place_total",
                              "Shared-memory plane requests whose values were read where the worker's flat "
                              "buffer holds them (its values segment), not copied into a request");
    m.shm_replies = &e.Counter("summa_server_shm_plane_replies_total",
                               "Shared-memory plane replies written into a connection's reply segment");
    m.step_seconds = &e.StepHistogram("summa_server_step_seconds", "Time between consecutive step completions");
    prometheus::Histogram* histogram = m.step_seconds;
    options.step_observer = [histogram](absl::Duration d) { histogram->Observe(absl::ToDoubleSeconds(d)); };
  }
  // Read and checked before anything starts, even when a checkpoint will take precedence: a
  // bad file is the operator's mistake to hear of now.
  std::optional<InitialWeights> initial;
  if (!options.init_from.empty()) {
    absl::StatusOr<InitialWeights> read =
        ReadInitialWeights(options.init_from, options.partition_bytes, options.limits.max_model_bytes);
    if (!read.ok()) return absl::Status(read.status().code(), absl::StrCat("--init_from: ", read.status().message()));
    initial = *std::move(read);
  }
  std::unique_ptr<SummaServer> server(new SummaServer(options, std::move(security.tokens)));
  server->metrics_ = std::move(metrics);
  server->m_ = m;
  if (!options.checkpoint_dir.empty()) {
    ParameterServer& core = server->core_;
    std::vector<std::string> warnings;
    absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestForShard(
        options.checkpoint_dir, options.shard, options.shards,
        [&](CheckpointReader& reader) { return core.Restore(reader.header(), reader); },
        [&](absl::Span<CheckpointReader* const> readers) {
          std::vector<ParameterServer::ShardCheckpoint> set;
          for (CheckpointReader* reader : readers) set.push_back({&reader->header(), reader});
          return core.RestoreResharded(set);
        },
        &warnings);
    for (const std::string& w : warnings) SUMMA_LOG(WARNING) << w;
    if (!restored.ok()) return restored.status();
    if (restored->has_value() && (*restored)->from_shards == 0) {
      SUMMA_LOG(INFO) << "restored " << (*restored)->path << " at version " << (*restored)->header.version();
    } else if (restored->has_value()) {
      const RestoredCheckpoint& r = **restored;
      SUMMA_LOG(INFO) << "restored version " << r.header.version() << " from the checkpoints of " << r.from_shards
                      << (r.from_shards == 1 ? " server" : " shards") << " (" << r.path
                      << (r.from_shards > 1 ? " and the other shards'" : "") << "): this server's "
                      << core.Status().partition_count << " partitions, re-sharded onto " << options.shards
                      << (options.shards == 1 ? " server" : " shards");
      // Its own checkpoint of the version it starts at, at once: the shards can roll back to it,
      // and a later restart needs no file of the old shard count.
      absl::Status written = core.MaybeCheckpoint(/*force=*/true);
      if (!written.ok()) SUMMA_LOG(ERROR) << "checkpoint of the re-sharded state failed: " << written.message();
    }
  }
  if (initial.has_value()) {
    ParameterServer& core = server->core_;
    if (core.Status().model_defined) {
      SUMMA_LOG(WARNING) << "--init_from=" << options.init_from << " not used: the checkpoint restored ("
                         << core.Status().checkpoint.path << ", version " << core.version()
                         << ") takes precedence";
    } else {
      const size_t tensors = initial->specs.size();
      const size_t values = initial->flat.size();
      if (absl::Status s = core.StartFrom(*std::move(initial)); !s.ok()) return s;
      SUMMA_LOG(INFO) << "the model starts from " << options.init_from << " (" << tensors << " tensors, " << values
                      << " parameters) at version 0; the first Join must describe the same tensors";
    }
  }
  absl::StatusOr<RunningServer> running =
      StartGrpcServer(address, {&server->service_}, {"summa.v1.ParameterServer"},
                      ServerCredentialsFor(security.tls), static_cast<int>(options.limits.max_message_bytes),
                      /*completion_queues=*/1);
  if (!running.ok()) return running.status();
  server->running_ = *std::move(running);
  server->data_path_ =
      std::make_unique<DataPath>(&server->service_, server->running_.queues[0].get(), DataPathThreads());
  if (!data_address.empty() || !shm_socket.empty()) {
    const LimitOptions& l = options.limits;
    SocketPlaneOptions plane_options;
    plane_options.max_message_bytes = l.max_message_bytes;
    plane_options.max_connections = l.max_data_plane_connections;
    plane_options.max_connections_in_hello = l.max_data_plane_connections_in_hello;
    plane_options.max_connections_in_hello_per_source = l.max_data_plane_connections_in_hello_per_source;
    plane_options.hello_timeout = l.data_plane_hello_timeout;
    plane_options.tls = security.tls;
    plane_options.tracer = options.tracer;
    // A worker's gradient buffers: two (one a step's exchange reads while backward fills the other).
    plane_options.max_values_segment_bytes = uint64_t{2} * static_cast<uint64_t>(l.max_model_bytes) + (64 << 10);
    if (!data_address.empty()) {
      absl::StatusOr<std::unique_ptr<SocketPlane>> plane =
          SocketPlane::Start(data_address, &server->service_, &server->tokens_, plane_options);
      if (!plane.ok()) return plane.status();
      server->socket_plane_ = *std::move(plane);
      server->service_.set_data_plane_port(server->socket_plane_->port(), security.tls.enabled());
    }
    if (!shm_socket.empty()) {
      // A number no earlier server at this path had: a client checks that the socket it reached
      // is the server it asked (another process may listen at the same path on its own host).
      std::random_device entropy;
      plane_options.shm_socket = shm_socket;
      plane_options.shm_instance = (uint64_t{entropy()} << 32) ^ entropy();
      absl::StatusOr<std::unique_ptr<SocketPlane>> plane =
          SocketPlane::Start("", &server->service_, &server->tokens_, plane_options);
      if (!plane.ok()) return plane.status();
      server->shm_plane_ = *std::move(plane);
      server->service_.set_shm_plane(shm_socket, plane_options.shm_instance);
      SUMMA_LOG(INFO) << "shared-memory plane on " << shm_socket;
    }
  }
  if (!health_address.empty()) {
    absl::StatusOr<RunningServer> health = StartHealthOnlyServer(health_address, server->running_.health.get());
    if (!health.ok()) return health.status();
    server->health_ = *std::move(health);
  }
  server->ticker_ = std::thread([s = server.get()] { s->TickLoop(); });
  if (server->core_.options().follower) {
    server->follower_ = std::make_unique<ShardFollower>(coordinator.address, coordinator.security, &server->core_);
    SUMMA_LOG(INFO) << "shard " << options.shard << " follows shard 0's membership view at " << coordinator.address;
  }
  return server;
}

void SummaServer::RunInBackground(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!ticker_done_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task();  // shutting down: no thread is left to run it later
}

void SummaServer::StopOnTerminationSignals() {
  if (signals_.joinable()) return;
  signals_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      mu_.Unlock();
      const int sig = WaitForTerminationSignal(absl::Milliseconds(100));
      mu_.Lock();
      if (sig != 0) {
        SUMMA_LOG(INFO) << "signal " << sig << ", shutting down";
        signalled_ = true;
        return;
      }
    }
  });
}

void SummaServer::TickLoop() {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
  for (;;) {
    mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(100));
    std::vector<std::function<void()>> tasks;
    tasks.swap(tasks_);
    const bool stopping = stop_;
    mu_.Unlock();
    for (auto& task : tasks) task();  // before stopping too: every queued call gets its answer
    if (!stopping) {
      const absl::Time now = core_.options().clock->Now();
      core_.Tick(now);
      hub_.ExpireRounds(now);
      tokens_.Refresh();  // rotated token files: read at most every kTokenRefreshSeconds
      if (metrics_) UpdateMetrics();
      absl::Status checkpoint = core_.MaybeCheckpoint(/*force=*/false);
      if (!checkpoint.ok() && !absl::IsFailedPrecondition(checkpoint)) {
        SUMMA_LOG(ERROR) << "checkpoint failed: " << checkpoint.message();
      }
    }
    std::string error = core_.job_error();
    mu_.Lock();
    if (!error.empty()) job_error_ = error;
    if (stopping && tasks_.empty()) {
      ticker_done_ = true;
      return;
    }
  }
}

void SummaServer::UpdateMetrics() {
  const StatusSnapshot s = core_.Status();
  AdvanceCounter(*m_.steps, static_cast<double>(s.version));
  AdvanceCounter(*m_.pushes, static_cast<double>(s.pushes_served));
  AdvanceCounter(*m_.pulls, static_cast<double>(s.pulls_served));
  AdvanceCounter(*m_.duplicates, static_cast<double>(s.duplicate_pushes));
  AdvanceCounter(*m_.nonfinite, static_cast<double>(s.nonfinite_pushes));
  m_.learning_rate->Set(s.learning_rate);
  AdvanceCounter(*m_.bytes_in, static_cast<double>(s.bytes_in));
  AdvanceCounter(*m_.bytes_out, static_cast<double>(s.bytes_out));
  AdvanceCounter(*m_.allreduce_rounds, static_cast<double>(hub_.rounds_completed()));
  m_.version->Set(static_cast<double>(s.version));
  int alive = 0;
  for (const MemberInfo& member : s.members) alive += member.state == MemberState::kAlive;
  m_.members_alive->Set(alive);
  AdvanceCounter(*m_.late_pushes, static_cast<double>(s.late_pushes));
  for (const MemberInfo& member : s.members) {
    if (member.rank < 0 || member.rank >= static_cast<int>(s.lateness.size())) continue;
    const RankLateness& l = s.lateness[member.rank];
    const std::map<std::string, std::string> rank = {{"rank", absl::StrCat(member.rank)}};
    AdvanceCounter(m_.member_late_pushes->Add(rank), static_cast<double>(l.late_pushes));
    m_.member_push_delay->Add(rank).Set(absl::ToDoubleSeconds(l.mean_delay()));
    m_.member_last_push_delay->Add(rank).Set(absl::ToDoubleSeconds(l.last_delay));
    m_.member_steps_behind->Add(rank).Set(static_cast<double>(l.steps_behind));
  }
  m_.table_bytes->Set(static_cast<double>(s.table_bytes));
  for (const TableCounters& t : s.tables) {
    const std::map<std::string, std::string> table = {{"table", t.name}};
    m_.table_rows->Add(table).Set(static_cast<double>(t.rows));
    m_.table_rows_waiting->Add(table).Set(static_cast<double>(t.rows_waiting_admission));
    AdvanceCounter(m_.table_rows_created->Add(table), static_cast<double>(t.rows_created));
    AdvanceCounter(m_.table_rows_expired->Add(table), static_cast<double>(t.rows_expired));
    AdvanceCounter(m_.table_rows_pulled->Add(table), static_cast<double>(t.rows_pulled));
    AdvanceCounter(m_.table_rows_pushed->Add(table), static_cast<double>(t.rows_pushed));
    AdvanceCounter(m_.table_dropped_gradients->Add(table), static_cast<double>(t.dropped_gradients));
  }
  if (socket_plane_) {
    m_.plane_connections->Set(socket_plane_->connections());
    AdvanceCounter(*m_.plane_hellos, static_cast<double>(socket_plane_->hellos_passed()));
    AdvanceCounter(*m_.plane_hellos_failed, static_cast<double>(socket_plane_->hellos_failed()));
    AdvanceCounter(*m_.plane_hello_evictions, static_cast<double>(socket_plane_->hello_evictions()));
  }
  if (shm_plane_) {
    m_.shm_connections->Set(shm_plane_->connections());
    AdvanceCounter(*m_.shm_requests, static_cast<double>(shm_plane_->requests_in_segments()));
    AdvanceCounter(*m_.shm_replies, static_cast<double>(shm_plane_->replies_in_segments()));
    AdvanceCounter(*m_.shm_values, static_cast<double>(shm_plane_->values_in_place()));
  }
  m_.checkpoint_age->Set(s.checkpoint.written == absl::InfinitePast()
                             ? -1
                             : absl::ToDoubleSeconds(core_.options().clock->Now() - s.checkpoint.written));
}

std::string SummaServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](SummaServer* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->shut_down_ || s->signalled_ || !s->job_error_.empty();
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
  service_.StopHoldingReports();  // followers are answered at once from here on
  if (ticker_.joinable()) ticker_.join();
  if (signals_.joinable()) signals_.join();
  follower_.reset();
  if (running_.health) running_.health->SetServing(false);
  // The last checkpoint: retried briefly, since partitions may be between versions of a step.
  if (!core_.options().checkpoint_dir.empty()) {
    absl::Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      s = core_.MaybeCheckpoint(/*force=*/true);
      if (!absl::IsFailedPrecondition(s)) break;
      absl::SleepFor(absl::Milliseconds(50));  // real time: the workers' pushes are in flight
    }
    if (!s.ok()) SUMMA_LOG(ERROR) << "final checkpoint failed: " << s.message();
  }
  if (const std::string& path = core_.options().export_path; !path.empty()) {
    const std::filesystem::path file(path);
    const std::string dir = file.has_parent_path() ? file.parent_path().string() : ".";
    absl::StatusOr<ExportedModel> exported = ExportWhenOneVersion(core_, dir, file.filename().string());
    final_export_ = exported.status();
    if (exported.ok()) {
      SUMMA_LOG(INFO) << "final weights (version " << exported->version << ", " << exported->tensors << " tensors, "
                      << exported->bytes << " bytes) exported to " << exported->path;
    } else {
      SUMMA_LOG(ERROR) << "--export=" << path << " failed: " << exported.status().message();
    }
  }
  core_.Shutdown();
  hub_.Shutdown();
  if (socket_plane_) socket_plane_->Stop();  // every call it carried is answered by now
  if (shm_plane_) shm_plane_->Stop();
  const StatusSnapshot totals = core_.Traffic();
  SUMMA_LOG(INFO) << "stopped: " << totals.pushes_served << " pushes ("
                  << totals.bytes_in << " bytes in), " << totals.pulls_served << " replies with weights ("
                  << totals.bytes_out << " bytes out)";
  if (running_.server) running_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  if (data_path_) data_path_->Stop();
  if (health_.server) health_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  shutdown_done_ = true;
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

SummaServer::~SummaServer() { Shutdown(); }

}  // namespace summa::server
