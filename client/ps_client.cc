#include "client/ps_client.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_status.h"
#include "common/logging.h"
#include "common/rpc/server_builder.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/tensor_proto.h"
#include "common/rpc/wire.h"
#include "client/grpc_transport.h"
#include "client/server_reasons.h"

namespace summa::worker {

namespace pb = ::summa::v1;

ParameterClient::ParameterClient(const std::string& address, absl::Duration call_deadline,
                                 absl::Duration join_deadline, int channels, ClientSecurity security)
    : address_(address), call_deadline_(call_deadline), join_deadline_(join_deadline),
      token_(std::move(security.token)), tls_(security.tls) {
  const std::shared_ptr<grpc::ChannelCredentials> credentials = ChannelCredentialsFor(security.tls);
  for (absl::string_view one : absl::StrSplit(address, ',')) {
    auto shard = std::make_unique<Shard>();
    shard->address = std::string(absl::StripAsciiWhitespace(one));
    for (int i = 0; i < std::max(1, channels); ++i) {
      grpc::ChannelArguments args = DefaultChannelArguments();
      // Channels with unlike arguments never share a connection.
      args.SetInt("summa.channel_index", i);
      std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(shard->address, credentials, args);
      if (i == 0) shard->stub = pb::ParameterServer::NewStub(channel);
      shard->generic.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
    shards_.push_back(std::move(shard));
  }
  sparse_ = std::make_unique<SparseCalls>(
      static_cast<int>(shards_.size()),
      [this](std::unique_ptr<DataTransport>* transport) { return RefreshSparseTransport(transport); });
}

ParameterClient::~ParameterClient() = default;

std::unique_ptr<grpc::ClientContext> ParameterClient::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_deadline_));
  AttachToken(token_.Current(), ctx.get());
  return ctx;
}

const char* DataPlaneName(DataPlane plane) {
  switch (plane) {
    case DataPlane::kAuto: return "auto";
    case DataPlane::kGrpc: return "grpc";
    case DataPlane::kSocket: return "socket";
    case DataPlane::kShm: return "shm";
  }
  return "?";
}

absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name) {
  for (DataPlane plane : {DataPlane::kAuto, DataPlane::kGrpc, DataPlane::kSocket, DataPlane::kShm}) {
    if (name == DataPlaneName(plane)) return plane;
  }
  return absl::InvalidArgumentError(absl::StrCat("--data_plane must be auto, grpc, socket or shm, not '", name, "'"));
}

std::unique_ptr<DataTransport> ParameterClient::NewGrpcTransport() const {
  std::vector<std::vector<grpc::GenericStub*>> channels;
  for (const auto& shard : shards_) {
    channels.emplace_back();
    for (const auto& stub : shard->generic) channels.back().push_back(stub.get());
  }
  return std::make_unique<GrpcTransport>(std::move(channels), token_);
}

absl::Status ParameterClient::ChooseDataPlane() {
  // A token rotated since the socket plane's connections said theirs: new connections say the
  // new one (the server stops taking the old one once its grace period is over).
  if (plane_chosen_ && transport_ != nullptr && transport_->socket_plane() && token_.Current() != plane_token_) {
    plane_chosen_ = false;
  }
  if (plane_chosen_) return absl::OkStatus();
  // A transport is replaced only between calls, none in flight: the socket plane's connections
  // go before new ones are opened.
  if (transport_ != nullptr && transport_->socket_plane()) transport_ = nullptr;
  bool ask_again = false;
  absl::StatusOr<std::unique_ptr<DataTransport>> socket =
      OpenSocketPlane(&plane_tls_, &plane_token_, &ask_again, /*log=*/true);
  // gRPC unless the socket data plane was opened, until the next Join.
  if ((!socket.ok() || *socket == nullptr) && transport_ == nullptr) transport_ = NewGrpcTransport();
  if (!socket.ok()) return socket.status();
  plane_chosen_ = !ask_again;
  if (*socket != nullptr) transport_ = *std::move(socket);
  if (values_.valid()) transport_->ShareValues(&values_);
  return absl::OkStatus();
}

absl::StatusOr<float*> ParameterClient::SharedValues(size_t floats) {
  if (rank_ < 0) return absl::FailedPreconditionError("SharedValues before Join");
  if (values_.valid()) return absl::FailedPreconditionError("the client's shared values were made already");
  SUMMA_RETURN_IF_ERROR(ChooseDataPlane());
  if (!on_shm_plane() || floats == 0) return nullptr;
  SUMMA_ASSIGN_OR_RETURN(values_, SharedSegment::Create("summa-values", floats * sizeof(float),
                                                        /*writable_by_others=*/false));
  transport_->ShareValues(&values_);
  return reinterpret_cast<float*>(values_.data());
}

absl::StatusOr<std::unique_ptr<DataTransport>> ParameterClient::OpenSocketPlane(
    std::unique_ptr<socket_plane::TlsContext>* tls, std::string* token, bool* ask_again, bool log) const {
  *ask_again = false;
  if (data_plane_ == DataPlane::kGrpc) return nullptr;
  // Where the socket data plane is not to be had: gRPC (an error where the plane was required).
  // `quiet`: the usual case (a server that serves no plane), not worth a warning. `again`: the
  // server did not answer (not up yet): ask at the next call instead.
  auto decline = [&](const absl::Status& why, bool quiet,
                     bool again = false) -> absl::StatusOr<std::unique_ptr<DataTransport>> {
    if (data_plane_ == DataPlane::kSocket || data_plane_ == DataPlane::kShm) {
      return absl::Status(why.code(), absl::StrCat("--data_plane=", DataPlaneName(data_plane_), ": ", why.message()));
    }
    if (log && !quiet) SUMMA_LOG(WARNING) << why.message() << "; the data path goes over gRPC";
    *ask_again = again;
    return nullptr;
  };
  std::vector<SocketCalls::Endpoint> endpoints;
  std::vector<bool> tcp_fallback;
  for (const auto& shard : shards_) {
    std::unique_ptr<grpc::ClientContext> context = NewContext();
    context->set_deadline(absl::ToChronoTime(absl::Now() + std::min(call_deadline_, absl::Seconds(10))));
    pb::DataPlaneResponse response;
    const grpc::Status asked = shard->stub->DataPlane(context.get(), pb::DataPlaneRequest(), &response);
    if (!asked.ok()) {
      const absl::Status why = FromGrpcStatus(asked);
      return decline(absl::Status(why.code(), absl::StrCat("asking ", shard->address, " for its data plane: ",
                                                           why.message())),
                     /*quiet=*/absl::IsUnimplemented(why),  // a server from before the plane
                     /*again=*/absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why));
    }
    const bool shm = data_plane_ != DataPlane::kSocket && !response.shm_socket().empty();
    if (data_plane_ == DataPlane::kShm && !shm) {
      return decline(absl::FailedPreconditionError(absl::StrCat(
                         shard->address, " serves no shared-memory plane (summa-server --shm_socket)")),
                     /*quiet=*/false);
    }
    if (!shm && (response.port() <= 0 || response.port() > 65535)) {
      return decline(absl::FailedPreconditionError(
                         absl::StrCat(shard->address, " serves no socket data plane (summa-server --data_address)")),
                     /*quiet=*/true);
    }
    // The plane speaks what the gRPC port speaks: a TLS client never sends its token in the clear
    // (the shared-memory plane never leaves the host).
    if (!shm && response.tls() != tls_.enabled()) {
      return decline(absl::FailedPreconditionError(absl::StrCat(
                         shard->address, "'s data plane speaks ", response.tls() ? "TLS" : "plaintext",
                         " and this client ", tls_.enabled() ? "TLS (--tls_ca)" : "plaintext")),
                     /*quiet=*/false);
    }
    absl::StatusOr<std::string> host = socket_plane::HostOf(shard->address);
    if (!host.ok()) return decline(host.status(), /*quiet=*/false);
    endpoints.push_back({*std::move(host), response.port(), shm ? response.shm_socket() : "",
                         response.shm_instance()});
    // Without a socket plane to fall back to (or its TLS unlike ours), this shard is shm or gRPC.
    tcp_fallback.push_back(response.port() > 0 && response.port() <= 65535 && response.tls() == tls_.enabled());
  }
  // The shared-memory plane's segments hold a partition's or an AllReduce chunk's message.
  uint64_t segment_bytes = kAllReduceChunkBytes;
  for (const PartitionRange& p : partitions_) segment_bytes = std::max<uint64_t>(segment_bytes, p.length * sizeof(float));
  segment_bytes += 64 << 10;  // the message's other fields
  if (tls_.enabled() && *tls == nullptr) {
    absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> made =
        socket_plane::TlsContext::Create(tls_, /*server=*/false);
    if (!made.ok()) return decline(made.status(), /*quiet=*/false);
    *tls = *std::move(made);
  }
  *token = token_.Current();
  auto calls = std::make_unique<SocketCalls>(endpoints, token->empty() ? "" : absl::StrCat("Bearer ", *token),
                                             tls->get(), segment_bytes);
  for (size_t k = 0; k < endpoints.size(); ++k) {
    // One connection each now: a plane that cannot be reached (a port no one exposed) shows here.
    absl::Status s = calls->Open(static_cast<int>(k), absl::Now() + absl::Seconds(10));
    if (!s.ok() && !endpoints[k].shm_socket.empty() && data_plane_ == DataPlane::kAuto && tcp_fallback[k]) {
      // The shard is on another host (no such socket here, or another server's): its socket plane.
      if (log) SUMMA_LOG(INFO) << s.message() << "; shard " << k << "'s calls take its socket data plane";
      calls->UseSocketPlane(static_cast<int>(k));
      s = calls->Open(static_cast<int>(k), absl::Now() + absl::Seconds(10));
    }
    if (!s.ok()) return decline(s, /*quiet=*/false);
  }
  if (log) {
    const SocketCalls::Endpoint& first = calls->endpoint(0);
    SUMMA_LOG(INFO) << "the data path goes over the "
                    << (first.shm_socket.empty() ? absl::StrCat("socket data plane (", first.host, ":", first.port)
                                                 : absl::StrCat("shared-memory plane (", first.shm_socket))
                    << (endpoints.size() > 1 ? " and the other shards'" : "") << ")";
  }
  return std::unique_ptr<DataTransport>(std::move(calls));
}

absl::Status ParameterClient::RefreshSparseTransport(std::unique_ptr<DataTransport>* transport) {
  // As ChooseDataPlane does for the dense path: made anew after a Join or a lost plane (null),
  // or where the plane's connections said a token rotated since.
  if (*transport == nullptr) sparse_plane_chosen_ = false;
  if (sparse_plane_chosen_ && (*transport)->socket_plane() && token_.Current() != sparse_plane_token_) {
    sparse_plane_chosen_ = false;
  }
  if (sparse_plane_chosen_) return absl::OkStatus();
  if (*transport != nullptr && (*transport)->socket_plane()) *transport = nullptr;
  bool ask_again = false;
  // The dense path's choice logs what it took, and why not the plane.
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<DataTransport> socket,
                         OpenSocketPlane(&sparse_plane_tls_, &sparse_plane_token_, &ask_again, /*log=*/false));
  sparse_plane_chosen_ = !ask_again;
  if (socket != nullptr) {
    *transport = std::move(socket);
  } else if (*transport == nullptr) {
    *transport = NewGrpcTransport();
  }
  return absl::OkStatus();
}

absl::Status ParameterClient::ForEach(size_t n, absl::FunctionRef<CallSpec(size_t)> start,
                                      absl::FunctionRef<std::string(size_t)> what, const char* trace_name,
                                      const std::function<bool(size_t, absl::Status*)>& again) {
  SUMMA_RETURN_IF_ERROR(ChooseDataPlane());
  if (tracer_ != nullptr && call_begun_.size() < n) call_begun_.resize(n);
  auto launch = [&](size_t i) {
    const CallSpec spec = start(i);
    if (tracer_ != nullptr) call_begun_[i] = absl::Now();
    transport_->Start(i, spec.shard, spec.method, spec.request, spec.reply,
                      absl::Now() + std::min(data_deadline_, spec.timeout));
  };
  for (size_t i = 0; i < n; ++i) launch(i);
  absl::Status first_error;
  for (size_t done = 0; done < n;) {
    size_t i;
    absl::Status st;
    // Every call has a deadline, so every call comes back.
    if (!transport_->Next(&i, &st)) return absl::InternalError("the client lost track of its calls in flight");
    if (i == DataTransport::kWoken) continue;  // a wake meant for a staged step's thread
    if (tracer_ != nullptr) tracer_->Complete(trace_name, "client", call_begun_[i], absl::Now(), static_cast<int64_t>(i));
    if (!st.ok()) {
      if (again != nullptr && again(i, &st)) {
        launch(i);
        continue;
      }
      if (first_error.ok()) first_error = Prefixed(what(i), st);
    }
    ++done;
  }
  if (transport_->lost()) plane_chosen_ = false;  // ask where the plane is again
  return first_error;
}

absl::Status ParameterClient::ForEachPartition(absl::FunctionRef<CallSpec(size_t)> start, const char* trace_name,
                                               const std::function<bool(size_t, absl::Status*)>& again) {
  return ForEach(
      partitions_.size(),
      [&](size_t i) {
        CallSpec spec = start(i);
        spec.shard = shard_of_[i];
        return spec;
      },
      [this](size_t i) { return partition_names_[i]; }, trace_name, again);
}

void ParameterClient::SetWireFormat(WireDType dtype, Compression compression, uint64_t next_step) {
  encoder_.Configure(partitions_, dtype, compression);
  const std::string dropped = encoder_.Rejoined(next_step);
  if (!dropped.empty()) SUMMA_LOG(WARNING) << dropped;
  pulled_.clear();
  for (size_t i = 0; i < partitions_.size(); ++i) {
    pull_requests_[i].set_dtype(WireDTypeToProto(dtype));
    push_headers_[i].set_dtype(WireDTypeToProto(dtype));
    push_headers_[i].set_sparse(compression.sparse());
    pulled_.emplace_back(dtype == WireDType::kFloat32 ? 0 : partitions_[i].length);
  }
}

absl::Status ParameterClient::DecodePull(size_t i, float* weights) {
  const PartitionRange& p = partitions_[i];
  const WireDType dtype = encoder_.dtype();
  constexpr int kDataPath[] = {pb::PullResponse::kDataFieldNumber};
  const std::string& what = partition_names_[i];
  bool got = false;
  if (dtype == WireDType::kFloat32) {
    SUMMA_RETURN_IF_ERROR(
        ParseWithBytes(replies_[i], kDataPath,
                       Exactly(reinterpret_cast<char*>(weights + p.offset), p.length * sizeof(float), &got, what),
                       &pull_headers_[i]));
  } else {
    // 16-bit values land in this partition's buffer, then widen into the weights.
    std::vector<uint16_t>& pulled = pulled_[i];
    SUMMA_RETURN_IF_ERROR(ParseWithBytes(replies_[i], kDataPath,
                                         Exactly(reinterpret_cast<char*>(pulled.data()), pulled.size() * sizeof(uint16_t),
                                                 &got, absl::StrCat(what, " (", WireDTypeName(dtype), ")")),
                                         &pull_headers_[i]));
  }
  replies_[i].Clear();
  if (!got) return absl::DataLossError(absl::StrCat(what, " came back without values"));
  shards_[shard_of_[i]]->view = pull_headers_[i].view();
  if (pull_headers_[i].dtype() != WireDTypeToProto(dtype)) {
    return absl::DataLossError(absl::StrCat(what, " came back as ", DTypeName(pull_headers_[i].dtype()),
                                            "; asked for ", DTypeName(WireDTypeToProto(dtype))));
  }
  if (dtype != WireDType::kFloat32) {
    DecodeValues(dtype, pulled_[i].data(), absl::MakeSpan(weights + p.offset, p.length));
  }
  return absl::OkStatus();
}

absl::Status ParameterClient::DecodePushPull(size_t i, uint64_t step, float* weights, bool may_skip) {
  SUMMA_RETURN_IF_ERROR(DecodePull(i, weights));
  const uint64_t version = pull_headers_[i].version();
  if (mode_ != pb::MODE_SYNC || version == step + 1) return absl::OkStatus();
  if (pull_headers_[i].late() && version > step + 1) {
    if (may_skip) return absl::OkStatus();
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "the push of step ", step, " to partition ", partitions_[i].id,
                          " came after its step completed (summa-server --backup_workers) and was dropped; the "
                          "partition is at version ", version, ", and this exchange cannot skip steps: join again")),
                      StatusReason::kLatePush);
  }
  return absl::InternalError(absl::StrCat("asked for version ", step + 1, " of partition ", partitions_[i].id,
                                          ", got ", version));
}

absl::StatusOr<uint64_t> ParameterClient::PullAll(uint64_t min_version, float* weights) {
  if (rank_ < 0) return absl::FailedPreconditionError("PullAll before Join");
  SUMMA_RETURN_IF_ERROR(ForEachPartition([&](size_t i) -> CallSpec {
    pull_requests_[i].set_min_version(min_version);
    requests_[i] = Encode(pull_requests_[i]);
    return {DataMethod::kPull, &requests_[i], &replies_[i]};
  }, "pull"));
  uint64_t version = UINT64_MAX;
  for (size_t i = 0; i < partitions_.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(DecodePull(i, weights));
    version = std::min(version, pull_headers_[i].version());
  }
  // With backup workers the others do not wait for this rank: its partitions may be a step apart.
  if (backup_workers_ > 0) return PullToOneVersion(weights);
  return version;
}

absl::StatusOr<uint64_t> ParameterClient::PullToOneVersion(float* weights) {
  // A worker pushes a step only once every partition is at it, so the partitions are never more
  // than a step apart; but they may move on while the behind ones are pulled, a step at a time.
  constexpr int kRounds = 16;
  std::vector<size_t> behind;
  for (int round = 0; round < kRounds; ++round) {
    uint64_t newest = 0;
    for (size_t i = 0; i < partitions_.size(); ++i) newest = std::max(newest, pull_headers_[i].version());
    behind.clear();
    for (size_t i = 0; i < partitions_.size(); ++i) {
      if (pull_headers_[i].version() < newest) behind.push_back(i);
    }
    if (behind.empty()) return newest;
    SUMMA_RETURN_IF_ERROR(ForEach(
        behind.size(),
        [&](size_t k) -> CallSpec {
          const size_t i = behind[k];
          pull_requests_[i].set_min_version(newest);
          requests_[i] = Encode(pull_requests_[i]);
          return {DataMethod::kPull, &requests_[i], &replies_[i], shard_of_[i]};
        },
        [&](size_t k) { return partition_names_[behind[k]]; }, "pull"));
    for (size_t i : behind) SUMMA_RETURN_IF_ERROR(DecodePull(i, weights));
  }
  return absl::UnavailableError(absl::StrCat("the partitions kept moving on while this worker pulled them to one "
                                             "version (", kRounds, " rounds): joining again"));
}

void ParameterClient::EncodePush(size_t i, uint64_t step, int64_t num_examples, const float* gradients) {
  const PartitionRange& p = partitions_[i];
  pb::PushRequest& header = push_headers_[i];
  header.set_step(step);
  header.set_num_examples(num_examples);
  header.set_view(shards_[shard_of_[i]]->view);
  const absl::string_view bytes =
      encoder_.dense_float32()
          ? absl::string_view(reinterpret_cast<const char*>(gradients + p.offset), p.length * sizeof(float))
          : encoder_.bytes(i);
  requests_[i] = EncodeWithBytes(header, pb::PushRequest::kDataFieldNumber, BorrowedSlice(bytes.data(), bytes.size()));
}

absl::Status ParameterClient::SendPushes(DataMethod method, const char* trace_name, uint64_t step,
                                        int64_t num_examples, const float* gradients) {
  std::vector<int> refreshes(partitions_.size(), 0);
  return ForEachPartition(
      [&](size_t i) -> CallSpec {
        EncodePush(i, step, num_examples, gradients);
        return {method, &requests_[i], &replies_[i]};
      },
      trace_name,
      [&](size_t i, absl::Status* refused) { return RetryRefusedPush(i, step, &refreshes[i], refused); });
}

bool ParameterClient::RetryRefusedPush(size_t i, uint64_t step, int* refreshes, absl::Status* refused) {
  constexpr int kRefreshes = 3;  // per partition and step
  if (!RefusedForStaleView(*refused) || recompute_on_stale_view_) return false;
  if (++*refreshes > kRefreshes) {
    *refused = absl::UnavailableError(absl::StrCat(refused->message(), " (still stale after ", kRefreshes,
                                                   " refreshes: joining again)"));
    return false;
  }
  Shard& shard = *shards_[shard_of_[i]];
  // Another refused push to this shard refreshed the view since this one was stamped.
  if (shard.view != push_headers_[i].view()) return true;
  pb::HeartbeatResponse heard;
  if (absl::Status asked = CallShard(shard, rank_, absl::Seconds(5), &pb::ParameterServer::Stub::Heartbeat, &heard);
      !asked.ok()) {
    *refused = std::move(asked);
    return false;
  }
  if (heard.view() != shard.view) {
    SUMMA_LOG(INFO) << "shard " << shard_of_[i] << " is at membership view " << heard.view()
                    << " (this worker had " << shard.view.load() << "); pushing step " << step << " to it again";
  }
  shard.view = heard.view();
  return true;
}

absl::StatusOr<uint64_t> ParameterClient::PushPull(uint64_t step, int64_t num_examples, const float* gradients,
                                                   float* weights, std::vector<int>* live_ranks) {
  if (rank_ < 0) return absl::FailedPreconditionError("PushPull before Join");
  encoder_.Encode(step, num_examples, gradients);
  SUMMA_RETURN_IF_ERROR(SendPushes(DataMethod::kPushPull, "pushpull", step, num_examples, gradients));
  bool skipped = false;
  for (size_t i = 0; i < partitions_.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(DecodePushPull(i, step, weights, /*may_skip=*/true));
    skipped = skipped || (mode_ == pb::MODE_SYNC && pull_headers_[i].version() != step + 1);
  }
  uint64_t next = step + 1;
  // Late (backup workers), and the others went on: every partition to the newest one's version.
  if (skipped) {
    SUMMA_ASSIGN_OR_RETURN(next, PullToOneVersion(weights));
  }
  if (live_ranks != nullptr && !pull_headers_.empty()) {
    live_ranks->assign(pull_headers_[0].live_ranks().begin(), pull_headers_[0].live_ranks().end());
  }
  return next;
}

absl::StatusOr<bool> ParameterClient::Push(uint64_t step, int64_t num_examples,
                                           const float* gradients) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Join");
  encoder_.Encode(step, num_examples, gradients);
  SUMMA_RETURN_IF_ERROR(SendPushes(DataMethod::kPush, "push", step, num_examples, gradients));
  bool completed = true;
  for (size_t i = 0; i < partitions_.size(); ++i) {
    pb::PushResponse reply;
    SUMMA_RETURN_IF_ERROR(ParseWithBytes(replies_[i], {}, nullptr, &reply));
    replies_[i].Clear();
    completed = completed && reply.completed_step();
  }
  return completed;
}

template <typename Request, typename Response>
absl::Status ParameterClient::CallShard(const Shard& shard, int rank, absl::Duration deadline,
                                        ShardMethod<Request, Response> method, Response* into) const {
  Request request;
  request.set_rank(rank);
  request.set_session(shard.session);
  Response local;
  Response& response = into != nullptr ? *into : local;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  AttachToken(token_.Current(), &ctx);
  return FromGrpcStatus(((*shard.stub).*method)(&ctx, request, &response));
}

// The pushes' view refresh (client/ps_client.cc) and the join's heartbeats (ps_client_join.cc).
template absl::Status ParameterClient::CallShard<pb::HeartbeatRequest, pb::HeartbeatResponse>(
    const Shard&, int, absl::Duration, ShardMethod<pb::HeartbeatRequest, pb::HeartbeatResponse>,
    pb::HeartbeatResponse*) const;

template <typename Request, typename Response>
absl::Status ParameterClient::EveryShard(int rank, absl::Duration deadline, ShardMethod<Request, Response> method,
                                         const std::function<void(Shard&, const Response&)>& answered) const {
  absl::Status first_error;
  for (const auto& shard : shards_) {
    Response response;
    absl::Status called = CallShard(*shard, rank, deadline, method, &response);
    if (called.ok() && answered != nullptr) answered(*shard, response);
    if (first_error.ok()) first_error = called;  // every shard is called, whatever one answers
  }
  return first_error;
}

absl::Status ParameterClient::Heartbeat(int rank) const {
  return EveryShard<pb::HeartbeatRequest, pb::HeartbeatResponse>(
      rank, absl::Seconds(5), &pb::ParameterServer::Stub::Heartbeat,
      [](Shard& shard, const pb::HeartbeatResponse& heard) { shard.view = heard.view(); });
}

absl::Status ParameterClient::Leave(int rank) {
  sparse_->SetMember({});
  return EveryShard(rank, absl::Seconds(10), &pb::ParameterServer::Stub::Leave);
}

}  // namespace summa::worker
