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

namespace summa::worker {

namespace pb = ::summa::v1;

namespace {

constexpr char kInitialize[] = "/summa.v1.ParameterServer/Initialize";
constexpr char kPush[] = "/summa.v1.ParameterServer/Push";
constexpr char kPull[] = "/summa.v1.ParameterServer/Pull";
constexpr char kPushPull[] = "/summa.v1.ParameterServer/PushPull";
constexpr char kAllReduce[] = "/summa.v1.ParameterServer/AllReduce";

// A slice over memory that outlives the call (the caller's buffer; every call here completes
// before the method that started it returns): sent without a copy.
grpc::Slice Borrowed(const float* values, int64_t count) {
  return grpc::Slice(values, count * sizeof(float), grpc::Slice::STATIC_SLICE);
}

// A destination for a reply's values: exactly `count` floats at `out`.
BytesDestination Exactly(float* out, int64_t count, bool* got, absl::string_view what) {
  return [=](uint64_t length) -> absl::StatusOr<char*> {
    if (length != static_cast<uint64_t>(count) * sizeof(float)) {
      return absl::DataLossError(absl::StrCat(what, " came back with ", length, " bytes, expected ",
                                              count * sizeof(float)));
    }
    *got = true;
    return reinterpret_cast<char*>(out);
  };
}

}  // namespace

ParameterClient::ParameterClient(const std::string& address, absl::Duration call_deadline,
                                 absl::Duration join_deadline, int channels, ClientSecurity security)
    : address_(address), call_deadline_(call_deadline), join_deadline_(join_deadline),
      token_(std::move(security.token)), tls_(security.tls.enabled()) {
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
}

bool NeedsAgreement(const std::vector<ShardVersions>& shards) {
  uint64_t low = UINT64_MAX, high = 0;
  for (const ShardVersions& s : shards) {
    low = std::min(low, s.version);
    high = std::max(high, s.version);
  }
  if (high - low > 1) return true;
  if (high == low) return false;
  for (const ShardVersions& s : shards) {
    if (s.version == low && s.restored) return true;
  }
  return false;
}

absl::StatusOr<Agreement> PlanAgreement(const std::vector<ShardVersions>& shards) {
  if (shards.empty()) return absl::InvalidArgumentError("no shards");
  uint64_t low = UINT64_MAX;
  for (const ShardVersions& s : shards) low = std::min(low, s.version);
  // Candidates, newest first: the lowest shard's version and any checkpoint below it.
  std::vector<uint64_t> candidates = {low};
  for (const ShardVersions& s : shards) {
    for (uint64_t v : s.checkpoints) {
      if (v <= low) candidates.push_back(v);
    }
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  for (uint64_t v : candidates) {
    bool feasible = true;
    for (const ShardVersions& s : shards) {
      feasible &= s.version == v || std::binary_search(s.checkpoints.begin(), s.checkpoints.end(), v);
    }
    if (!feasible) continue;
    // Every shard is asked, those at `v` too: one whose lowest partition is at `v` may hold
    // others a step on, and the step is redone from `v` everywhere (a shard wholly at `v`
    // changes nothing).
    Agreement plan{v, {}};
    for (size_t i = 0; i < shards.size(); ++i) plan.roll_back.push_back(static_cast<int>(i));
    return plan;
  }
  std::string kept;
  for (size_t i = 0; i < shards.size(); ++i) {
    absl::StrAppend(&kept, i == 0 ? "" : "; ", "shard ", i, " at version ", shards[i].version, " keeps ",
                    shards[i].checkpoints.empty() ? "no checkpoints" : absl::StrCat("checkpoints of versions ",
                                                                                      absl::StrJoin(shards[i].checkpoints, ", ")));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no version is common to every shard (", kept, "); start the shards with a larger --keep_checkpoints, or "
      "restart every shard from checkpoints of one version"));
}

ParameterClient::~ParameterClient() {
  queue_.Shutdown();
  void* tag;
  bool ok;
  while (queue_.Next(&tag, &ok)) {
  }
}

std::unique_ptr<grpc::ClientContext> ParameterClient::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_deadline_));
  AttachToken(token_, ctx.get());
  return ctx;
}

absl::StatusOr<pb::JoinResponse> ParameterClient::JoinShard(size_t index, const pb::JoinRequest& request) {
  Shard& shard = *shards_[index];
  const absl::Time give_up = absl::Now() + join_deadline_;
  absl::Duration backoff = absl::Milliseconds(50);
  pb::JoinResponse response;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(10))));
    AttachToken(token_, &ctx);
    grpc::Status s = shard.stub->Join(&ctx, request, &response);
    if (s.ok()) return response;
    // A server over its join rate (summa-server --join_rate) takes us a moment later; its other
    // RESOURCE_EXHAUSTED refusals (a model over its limit) stand.
    absl::Status st = FromGrpcStatus(s);
    const bool retry = absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) || IsJoinRateLimited(st);
    if (!retry || absl::Now() + backoff >= give_up) {
      return absl::Status(st.code(), absl::StrCat("join ", shard.address, " as rank ", request.rank(),
                                                  " failed after ", attempt, " attempts: ", st.message()));
    }
    if (attempt == 1 || attempt % 20 == 0) {
      SUMMA_LOG(INFO) << "waiting for the server at " << shard.address << ": " << s.error_message();
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
    // The shards joined already keep this rank's lease while this one is awaited (a
    // StatefulSet may start its pods one after another); their answers are not waited on here:
    // a lost lease shows at the next call.
    for (size_t j = 0; j < index; ++j) {
      CallShard(*shards_[j], request.rank(), absl::Seconds(5), &pb::ParameterServer::Stub::Heartbeat).IgnoreError();
    }
  }
}

absl::StatusOr<JoinInfo> ParameterClient::Join(int rank, int world,
                                               const std::vector<TensorSpec>& specs,
                                               const float* initial,
                                               const std::string& status_address) {
  plane_chosen_ = false;  // a restarted server may serve its data plane elsewhere
  pb::JoinRequest request;
  request.set_rank(rank);
  request.set_world_size(world);
  request.set_status_address(status_address);
  int64_t offset = 0;
  for (const TensorSpec& s : specs) {
    pb::Tensor* t = request.add_params();
    t->set_name(s.name);
    t->set_dtype(pb::DTYPE_FLOAT32);
    for (int64_t d : s.shape) t->add_shape(d);
    offset += s.num_elements();
  }
  // The values, when this worker has them, follow partition by partition (SendInitialValues):
  // no message holds the whole model.
  request.set_values_follow(initial != nullptr);
  // Shard 0 first: it assigns the rank (when asked to) that the others are joined with.
  const int k = static_cast<int>(shards_.size());
  std::vector<pb::JoinResponse> responses;
  // A pass that rolls shards back voids this rank's sessions there: it joins again. Two passes
  // settle it (another worker's rollback meanwhile is found done); a third finds a fault.
  constexpr int kPasses = 3;
  for (int pass = 1;; ++pass) {
    responses.clear();
    for (int i = 0; i < k; ++i) {
      SUMMA_ASSIGN_OR_RETURN(pb::JoinResponse response, JoinShard(i, request));
      shards_[i]->session = response.session();
      shards_[i]->view = response.view();
      const int said = std::max(1, response.shards());
      if (response.shard() != i || said != k) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the server at ", shards_[i]->address, " is shard ", response.shard(), " of ", said,
            "; --server lists it as shard ", i, " of ", k, " (give every shard's address, in shard order)"));
      }
      if (i == 0) {
        request.set_rank(response.rank());
      } else if (response.mode() != responses[0].mode() || response.wire_dtype() != responses[0].wire_dtype() ||
                 response.topk_ratio() != responses[0].topk_ratio()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the shards disagree: shard ", i, " (", shards_[i]->address, ") runs another mode or wire format than "
            "shard 0 (", shards_[0]->address, "): start every shard with the same job flags"));
      }
      responses.push_back(std::move(response));
    }
    // One step apart is a push-pull that reached some shards and not others, as it may reach
    // some partitions of one server: the step is pushed again, and a shard that has it takes
    // it as a duplicate. Further apart, or one step with the one behind restored, a shard was
    // restored from an older checkpoint: in sync mode every shard goes to a version all keep.
    std::string where;
    std::vector<ShardVersions> versions;
    uint64_t low = UINT64_MAX, high = 0;
    for (int i = 0; i < k; ++i) {
      const pb::JoinResponse& r = responses[i];
      low = std::min(low, r.next_step());
      high = std::max(high, r.next_step());
      absl::StrAppend(&where, i == 0 ? "" : ", ", "shard ", i, " (", shards_[i]->address, ") at step ",
                      r.next_step(), r.restored() ? " (restored)" : "");
      versions.push_back({r.version(), {r.checkpoint_versions().begin(), r.checkpoint_versions().end()},
                          r.restored()});
    }
    const bool sync = responses[0].mode() == pb::MODE_SYNC;
    if (high - low <= 1 && !(sync && NeedsAgreement(versions))) break;
    if (!sync || pass == kPasses) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shards disagree: they resume rank ", request.rank(), " at ", where,
          responses[0].mode() != pb::MODE_SYNC ? "; only sync mode rolls shards back: restart every shard from "
                                                 "checkpoints of one version"
                                               : absl::StrCat(" after ", pass - 1, " passes of rollbacks")));
    }
    absl::StatusOr<Agreement> agreement = PlanAgreement(versions);
    if (!agreement.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the shards disagree: ", where, ": ", agreement.status().message()));
    }
    for (int i : agreement->roll_back) {
      pb::RollBackRequest ask;
      ask.set_rank(request.rank());
      ask.set_session(responses[i].session());
      ask.set_to_version(agreement->version);
      ask.set_from_version(responses[i].version());
      pb::RollBackResponse answer;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + call_deadline_));
      AttachToken(token_, &ctx);
      const absl::Status s = FromGrpcStatus(shards_[i]->stub->RollBack(&ctx, ask, &answer));
      // NOT_FOUND: another member's rollback voided our session first; ABORTED: the shard moved.
      // Either way the next pass looks again.
      if (!s.ok() && !absl::IsNotFound(s) && !absl::IsAborted(s)) {
        return absl::Status(s.code(), absl::StrCat("the shards disagree (", where, "); rolling shard ", i, " (",
                                                   shards_[i]->address, ") back to version ",
                                                   agreement->version, " failed: ", s.message()));
      }
      SUMMA_LOG(WARNING) << "rank " << request.rank() << ": the shards disagree (" << where << "); shard " << i
                         << (s.ok() && answer.rolled_back() ? " rolled back" : " asked to roll back") << " to version "
                         << agreement->version << (s.ok() ? "" : absl::StrCat(" (", s.message(), ")"));
    }
  }
  const pb::JoinResponse& response = responses[0];
  JoinInfo info;
  info.rank = response.rank();
  info.version = response.version();
  info.next_step = response.next_step();
  info.mode = response.mode();
  info.staleness = response.staleness();
  if (response.lease_seconds() > 0) info.lease = absl::Seconds(response.lease_seconds());
  info.live_ranks.assign(response.live_ranks().begin(), response.live_ranks().end());
  // Every shard's partitions, in offset order, must tile the model.
  std::vector<std::pair<PartitionRange, int>> held;
  for (int i = 0; i < k; ++i) {
    info.version = std::min(info.version, responses[i].version());
    info.next_step = std::min(info.next_step, responses[i].next_step());
    for (const pb::Partition& p : responses[i].partitions()) held.push_back({{p.id(), p.offset(), p.length()}, i});
  }
  std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first.offset < b.first.offset; });
  int64_t expected = 0;
  shard_of_.clear();
  for (const auto& [p, shard] : held) {
    if (p.offset != expected || p.length <= 0) {
      return absl::InternalError(absl::StrCat("the server's partition ", p.id, " at offset ", p.offset,
                                              " does not tile the model"));
    }
    expected += p.length;
    info.partitions.push_back(p);
    shard_of_.push_back(shard);
  }
  if (expected != offset) {
    return absl::FailedPreconditionError(absl::StrCat("the server's partitions cover ", expected,
                                                      " parameters; this worker's model has ", offset));
  }
  const std::optional<WireDType> wire = WireDTypeFromProto(response.wire_dtype(), /*unspecified_is_float32=*/true);
  if (!wire.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("the server at ", shards_[0]->address, " asks for wire dtype ",
                                                      DTypeName(response.wire_dtype()),
                                                      ", which this worker does not know"));
  }
  Compression compression;
  compression.topk_ratio = response.topk_ratio();
  if (compression.topk_ratio < 0 || compression.topk_ratio >= 1) {
    return absl::FailedPreconditionError(absl::StrCat("the server at ", shards_[0]->address, " asks for top-k ratio ",
                                                      compression.topk_ratio, "; it must be in [0, 1)"));
  }
  info.wire_dtype = *wire;
  info.compression = compression;
  rank_ = info.rank;
  mode_ = info.mode;
  partitions_ = info.partitions;
  push_headers_.assign(partitions_.size(), pb::PushRequest());
  pull_requests_.assign(partitions_.size(), pb::PullRequest());
  requests_.assign(partitions_.size(), grpc::ByteBuffer());
  replies_.assign(partitions_.size(), grpc::ByteBuffer());
  pull_headers_.assign(partitions_.size(), pb::PullResponse());
  partition_names_.clear();
  for (size_t i = 0; i < partitions_.size(); ++i) {
    const uint64_t session = responses[shard_of_[i]].session();
    push_headers_[i].set_rank(rank_);
    push_headers_[i].set_session(session);
    push_headers_[i].set_partition(partitions_[i].id);
    pull_requests_[i].set_rank(rank_);
    pull_requests_[i].set_session(session);
    pull_requests_[i].set_partition(partitions_[i].id);
    partition_names_.push_back(k == 1 ? absl::StrCat("partition ", partitions_[i].id)
                                      : absl::StrCat("partition ", partitions_[i].id, " (shard ", shard_of_[i], ")"));
  }
  SetWireFormat(*wire, compression, info.next_step);
  std::vector<bool> initialize(k);
  bool any = false;
  for (int i = 0; i < k; ++i) any |= initialize[i] = responses[i].initialize();
  if (any) SUMMA_RETURN_IF_ERROR(SendInitialValues(initial, initialize));
  return info;
}

absl::Status ParameterClient::SendInitialValues(const float* initial, const std::vector<bool>& initialize) {
  // A window of partitions in flight: the server buffers at most that many at once.
  constexpr size_t kWindow = 8;
  std::vector<size_t> due;  // the partitions to send
  for (size_t i = 0; i < partitions_.size(); ++i) {
    if (initialize[shard_of_[i]]) due.push_back(i);
  }
  size_t applied = 0;
  for (size_t first = 0; first < due.size(); first += kWindow) {
    const size_t n = std::min(kWindow, due.size() - first);
    SUMMA_RETURN_IF_ERROR(ForEach(
        n,
        [&](size_t k) -> CallSpec {
          const size_t i = due[first + k];
          const PartitionRange& p = partitions_[i];
          pb::InitializeRequest header;
          header.set_rank(rank_);
          header.set_session(shards_[shard_of_[i]]->session);
          header.set_partition(p.id);
          header.set_dtype(pb::DTYPE_FLOAT32);
          std::string prefix = header.SerializeAsString();
          AppendFieldHeader(pb::InitializeRequest::kDataFieldNumber, p.length * sizeof(float), &prefix);
          requests_[i] = TwoSlices(prefix, Borrowed(initial + p.offset, p.length));
          return {kInitialize, &requests_[i], &replies_[i], shard_of_[i]};
        },
        [&](size_t k) { return absl::StrCat("initial values of ", partition_names_[due[first + k]]); },
        "initialize"));
    for (size_t j = first; j < first + n; ++j) {
      const size_t i = due[j];
      pb::InitializeResponse reply;
      SUMMA_RETURN_IF_ERROR(ParseWithBytes(replies_[i], {}, nullptr, &reply));
      replies_[i].Clear();
      applied += reply.applied();
    }
  }
  SUMMA_LOG(INFO) << "sent the initial values of " << applied << " of " << due.size()
                  << " partitions (the others had theirs)";
  return absl::OkStatus();
}

const char* DataPlaneName(DataPlane plane) {
  switch (plane) {
    case DataPlane::kAuto: return "auto";
    case DataPlane::kGrpc: return "grpc";
    case DataPlane::kSocket: return "socket";
  }
  return "?";
}

absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name) {
  for (DataPlane plane : {DataPlane::kAuto, DataPlane::kGrpc, DataPlane::kSocket}) {
    if (name == DataPlaneName(plane)) return plane;
  }
  return absl::InvalidArgumentError(absl::StrCat("--data_plane must be auto, grpc or socket, not '", name, "'"));
}

absl::Status ParameterClient::ChooseDataPlane() {
  if (plane_chosen_) return absl::OkStatus();
  socket_.reset();
  if (data_plane_ == DataPlane::kGrpc) {
    plane_chosen_ = true;
    return absl::OkStatus();
  }
  // Where the socket data plane is not to be had: gRPC carries the data path until the next Join
  // (an error where the plane was required). `quiet`: the usual case (a server that serves no
  // plane), not worth a warning. `ask_again`: the server did not answer (not up yet): ask at the
  // next call instead.
  auto decline = [&](const absl::Status& why, bool quiet, bool ask_again = false) {
    if (data_plane_ == DataPlane::kSocket) {
      return absl::Status(why.code(), absl::StrCat("--data_plane=socket: ", why.message()));
    }
    if (!quiet) SUMMA_LOG(WARNING) << why.message() << "; the data path goes over gRPC";
    plane_chosen_ = !ask_again;
    return absl::OkStatus();
  };
  if (tls_) {
    return decline(absl::FailedPreconditionError("the socket data plane is plaintext: not for a TLS job"),
                   /*quiet=*/true);
  }
  std::vector<SocketCalls::Endpoint> endpoints;
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
                     /*ask_again=*/absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why));
    }
    if (response.port() <= 0 || response.port() > 65535) {
      return decline(absl::FailedPreconditionError(
                         absl::StrCat(shard->address, " serves no socket data plane (summa-server --data_address)")),
                     /*quiet=*/true);
    }
    absl::StatusOr<std::string> host = socket_plane::HostOf(shard->address);
    if (!host.ok()) return decline(host.status(), /*quiet=*/false);
    endpoints.push_back({*std::move(host), response.port()});
  }
  auto calls = std::make_unique<SocketCalls>(endpoints, token_.empty() ? "" : absl::StrCat("Bearer ", token_));
  for (size_t k = 0; k < endpoints.size(); ++k) {
    // One connection each now: a plane that cannot be reached (a port no one exposed) shows here.
    if (absl::Status s = calls->Open(static_cast<int>(k), absl::Now() + absl::Seconds(10)); !s.ok()) {
      return decline(s, /*quiet=*/false);
    }
  }
  socket_ = std::move(calls);
  plane_chosen_ = true;
  SUMMA_LOG(INFO) << "the data path goes over the socket data plane (" << endpoints.front().host << ":"
                  << endpoints.front().port << (endpoints.size() > 1 ? " and the other shards'" : "") << ")";
  return absl::OkStatus();
}

template <typename Start, typename What>
absl::Status ParameterClient::ForEach(size_t n, Start start, What what, const char* trace_name,
                                      const std::function<bool(size_t, absl::Status*)>& again) {
  SUMMA_RETURN_IF_ERROR(ChooseDataPlane());
  // Every call starts on this client's completion queue (or its socket calls), and this thread
  // collects the replies: no gRPC thread wakes another to hand a reply over (a hop costs tens of
  // µs on a small VM).
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    grpc::Status status;
    absl::Time begun;
  };
  std::vector<Call> calls(n);
  // Each shard's calls take its channels in turn (a call's index would pick the same channel of
  // a shard every time where the calls are dealt round the shards).
  std::vector<size_t> next_channel(shards_.size(), 0);
  auto launch = [&](size_t i) {
    const CallSpec spec = start(i);
    Call& c = calls[i];
    c.begun = tracer_ != nullptr ? absl::Now() : absl::InfinitePast();
    if (socket_ != nullptr) {
      socket_->Start(i, spec.shard, *socket_plane::DataMethodOf(spec.method), spec.request, spec.reply,
                     absl::Now() + call_deadline_);
      return;
    }
    // A finished call's reader lives in its call's arena, which its context frees: the reader
    // goes first (as the Call's own destructor does it).
    c.reader.reset();
    c.context = NewContext();
    c.status = grpc::Status();
    const Shard& shard = *shards_[spec.shard];
    const size_t channel = next_channel[spec.shard]++ % shard.generic.size();
    c.reader = shard.generic[channel]->PrepareUnaryCall(c.context.get(), spec.method, *spec.request, &queue_);
    c.reader->StartCall();
    c.reader->Finish(spec.reply, &c.status, reinterpret_cast<void*>(i));
  };
  // The next call to end, and how it ended; false when none is left (which cannot happen while
  // calls are in flight: every call has a deadline, so every call comes back).
  auto next = [&](size_t* i, absl::Status* status) {
    if (socket_ != nullptr) return socket_->Next(i, status);
    void* tag;
    bool ok;
    if (!queue_.Next(&tag, &ok)) return false;
    *i = reinterpret_cast<size_t>(tag);
    *status = FromGrpcStatus(calls[*i].status);
    return true;
  };
  for (size_t i = 0; i < n; ++i) launch(i);
  absl::Status first_error;
  for (size_t done = 0; done < n;) {
    size_t i;
    absl::Status st;
    if (!next(&i, &st)) return absl::InternalError("the client lost track of its calls in flight");
    if (tracer_ != nullptr) tracer_->Complete(trace_name, "client", calls[i].begun, absl::Now(), static_cast<int64_t>(i));
    if (!st.ok()) {
      if (again != nullptr && again(i, &st)) {
        launch(i);  // its earlier reader has finished: replaced
        continue;
      }
      if (first_error.ok()) first_error = absl::Status(st.code(), absl::StrCat(what(i), ": ", st.message()));
    }
    ++done;
  }
  if (socket_ != nullptr && socket_->lost()) plane_chosen_ = false;  // ask where the plane is again
  return first_error;
}

template <typename Start>
absl::Status ParameterClient::ForEachPartition(Start start, const char* trace_name,
                                               const std::function<bool(size_t, absl::Status*)>& again) {
  return ForEach(
      partitions_.size(),
      [&](size_t i) {
        CallSpec spec = start(i);
        spec.shard = shard_of_[i];
        return spec;
      },
      [this](size_t i) -> const std::string& { return partition_names_[i]; }, trace_name, again);
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
        ParseWithBytes(replies_[i], kDataPath, Exactly(weights + p.offset, p.length, &got, what), &pull_headers_[i]));
  } else {
    // 16-bit values land in this partition's buffer, then widen into the weights.
    std::vector<uint16_t>& pulled = pulled_[i];
    SUMMA_RETURN_IF_ERROR(ParseWithBytes(
        replies_[i], kDataPath,
        [&](uint64_t length) -> absl::StatusOr<char*> {
          if (length != pulled.size() * sizeof(uint16_t)) {
            return absl::DataLossError(absl::StrCat(what, " came back with ", length, " bytes, expected ",
                                                    pulled.size() * sizeof(uint16_t), " (", WireDTypeName(dtype), ")"));
          }
          got = true;
          return reinterpret_cast<char*>(pulled.data());
        },
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

absl::StatusOr<uint64_t> ParameterClient::PullAll(uint64_t min_version, float* weights) {
  if (rank_ < 0) return absl::FailedPreconditionError("PullAll before Join");
  SUMMA_RETURN_IF_ERROR(ForEachPartition([&](size_t i) -> CallSpec {
    pull_requests_[i].set_min_version(min_version);
    requests_[i] = Encode(pull_requests_[i]);
    return {kPull, &requests_[i], &replies_[i]};
  }, "pull"));
  uint64_t version = UINT64_MAX;
  for (size_t i = 0; i < partitions_.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(DecodePull(i, weights));
    version = std::min(version, pull_headers_[i].version());
  }
  return version;
}

void ParameterClient::EncodePush(size_t i, uint64_t step, int64_t num_examples, const float* gradients) {
  const PartitionRange& p = partitions_[i];
  pb::PushRequest& header = push_headers_[i];
  header.set_step(step);
  header.set_num_examples(num_examples);
  header.set_view(shards_[shard_of_[i]]->view);
  std::string prefix = header.SerializeAsString();
  if (encoder_.dense_float32()) {
    AppendFieldHeader(pb::PushRequest::kDataFieldNumber, p.length * sizeof(float), &prefix);
    requests_[i] = TwoSlices(prefix, Borrowed(gradients + p.offset, p.length));
    return;
  }
  const absl::string_view bytes = encoder_.bytes(i);
  AppendFieldHeader(pb::PushRequest::kDataFieldNumber, bytes.size(), &prefix);
  requests_[i] = TwoSlices(prefix, grpc::Slice(bytes.data(), bytes.size(), grpc::Slice::STATIC_SLICE));
}

absl::Status ParameterClient::SendPushes(const char* method, const char* trace_name, uint64_t step,
                                        int64_t num_examples, const float* gradients) {
  constexpr int kRefreshes = 3;  // per partition and step
  std::vector<int> refreshes(partitions_.size(), 0);
  return ForEachPartition(
      [&](size_t i) -> CallSpec {
        EncodePush(i, step, num_examples, gradients);
        return {method, &requests_[i], &replies_[i]};
      },
      trace_name,
      [&](size_t i, absl::Status* refused) {
        if (!IsStaleView(*refused)) return false;
        if (++refreshes[i] > kRefreshes) {
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
                          << " (this worker had " << shard.view.load() << "); pushing step " << step
                          << " to it again";
        }
        shard.view = heard.view();
        return true;
      });
}

absl::Status ParameterClient::PushPull(uint64_t step, int64_t num_examples, const float* gradients,
                                       float* weights, std::vector<int>* live_ranks) {
  if (rank_ < 0) return absl::FailedPreconditionError("PushPull before Join");
  encoder_.Encode(step, num_examples, gradients);
  SUMMA_RETURN_IF_ERROR(SendPushes(kPushPull, "pushpull", step, num_examples, gradients));
  for (size_t i = 0; i < partitions_.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(DecodePull(i, weights));
    if (mode_ == pb::MODE_SYNC && pull_headers_[i].version() != step + 1) {
      return absl::InternalError(absl::StrCat("asked for version ", step + 1, " of partition ",
                                              partitions_[i].id, ", got ", pull_headers_[i].version()));
    }
  }
  if (live_ranks != nullptr && !pull_headers_.empty()) {
    live_ranks->assign(pull_headers_[0].live_ranks().begin(), pull_headers_[0].live_ranks().end());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterClient::Push(uint64_t step, int64_t num_examples,
                                           const float* gradients) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Join");
  encoder_.Encode(step, num_examples, gradients);
  SUMMA_RETURN_IF_ERROR(SendPushes(kPush, "push", step, num_examples, gradients));
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
  AttachToken(token_, &ctx);
  return FromGrpcStatus(((*shard.stub).*method)(&ctx, request, &response));
}

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
  return EveryShard(rank, absl::Seconds(10), &pb::ParameterServer::Stub::Leave);
}

absl::StatusOr<std::vector<float>> ParameterClient::AllReduce(const Collective& group,
                                                              const std::vector<float>& values) {
  std::vector<float> sum(values.size());
  SUMMA_RETURN_IF_ERROR(AllReduceInto(group, values, absl::MakeSpan(sum)));
  return sum;
}

ParameterClient::AllReducePlan ParameterClient::PlanAllReduce(int64_t floats, int shards, bool members) {
  constexpr int64_t kChunk = kAllReduceChunkBytes / sizeof(float);
  constexpr int64_t kMinSpread = kMinSpreadChunkBytes / sizeof(float);
  AllReducePlan plan;
  plan.floats = floats;
  plan.shards = members ? 1 : std::max(1, shards);
  plan.chunk_floats = kChunk;
  plan.count = std::max<int64_t>(1, (floats + kChunk - 1) / kChunk);
  if (plan.shards == 1) return plan;
  plan.count = std::max(plan.count, std::min<int64_t>(plan.shards, floats / kMinSpread));
  if (plan.count >= plan.shards) plan.count = (plan.count + plan.shards - 1) / plan.shards * plan.shards;
  plan.chunk_floats = std::max<int64_t>(1, (floats + plan.count - 1) / plan.count);
  return plan;
}

absl::Status ParameterClient::AllReduceInto(const Collective& group, absl::Span<const float> values,
                                            absl::Span<float> sum) {
  if (sum.size() != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce of ", values.size(), " values into ",
                                                   sum.size()));
  }
  const int64_t total = static_cast<int64_t>(values.size());
  const AllReducePlan plan = PlanAllReduce(total, static_cast<int>(shards_.size()), group.members);
  const size_t chunks = static_cast<size_t>(plan.count);
  auto name = [&](size_t k) {
    return chunks == 1 ? group.name : absl::StrCat(group.name, "/", k, "of", chunks);
  };
  auto range = [&](size_t k) { return plan.Range(static_cast<int64_t>(k)); };
  std::vector<grpc::ByteBuffer> requests(chunks), replies(chunks);
  // The requests' values are read from `values` while the calls run: `sum` (which may be the
  // same memory) is written only after every call has completed.
  SUMMA_RETURN_IF_ERROR(ForEach(
      chunks,
      [&](size_t k) -> CallSpec {
        const auto [begin, count] = range(k);
        pb::AllReduceRequest outer;
        outer.set_name(name(k));
        outer.set_group_size(group.group_size);
        outer.set_rank(group.rank);
        outer.set_members(group.members);
        outer.set_round(group.round);
        if (group.members) outer.set_session(shards_[0]->session);
        pb::Tensor tensor;
        tensor.set_name(outer.name());
        tensor.set_dtype(pb::DTYPE_FLOAT32);
        tensor.add_shape(count);
        const uint64_t bytes = count * sizeof(float);
        std::string tensor_prefix = tensor.SerializeAsString();
        AppendFieldHeader(pb::Tensor::kDataFieldNumber, bytes, &tensor_prefix);
        std::string prefix = outer.SerializeAsString();
        AppendFieldHeader(pb::AllReduceRequest::kTensorFieldNumber, tensor_prefix.size() + bytes, &prefix);
        prefix += tensor_prefix;
        requests[k] = TwoSlices(prefix, Borrowed(values.data() + begin, count));
        return {kAllReduce, &requests[k], &replies[k], plan.Shard(static_cast<int64_t>(k))};
      },
      [&](size_t k) { return absl::StrCat("AllReduce '", name(k), "'"); }, "allreduce"));
  for (size_t k = 0; k < chunks; ++k) {
    const auto [begin, count] = range(k);
    constexpr int kDataPath[] = {pb::AllReduceResponse::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};
    bool got = false;
    pb::AllReduceResponse header;
    SUMMA_RETURN_IF_ERROR(ParseWithBytes(
        replies[k], kDataPath, Exactly(sum.data() + begin, count, &got, absl::StrCat("AllReduce '", name(k), "'")),
        &header));
    if (!got) return absl::DataLossError(absl::StrCat("AllReduce '", name(k), "' came back without values"));
  }
  return absl::OkStatus();
}

}  // namespace summa::worker
