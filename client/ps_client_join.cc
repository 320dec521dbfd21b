// ParameterClient: joining every shard (retries, the shards' agreement on a version), the
// partition layout, and the initial values. The rest is client/ps_client.cc.
#include "client/ps_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/wire.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/tensor_proto.h"
#include "client/server_reasons.h"
#include "client/shard_agreement.h"

namespace summa::worker {

namespace pb = ::summa::v1;

absl::StatusOr<pb::JoinResponse> ParameterClient::JoinShard(size_t index, const pb::JoinRequest& request) {
  Shard& shard = *shards_[index];
  const absl::Time give_up = absl::Now() + join_deadline_;
  absl::Duration backoff = absl::Milliseconds(50);
  pb::JoinResponse response;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(10))));
    AttachToken(token_.Current(), &ctx);
    grpc::Status s = shard.stub->Join(&ctx, request, &response);
    if (s.ok()) return response;
    // A server over its join rate (summa-server --join_rate) takes us a moment later; its other
    // RESOURCE_EXHAUSTED refusals (a model over its limit) stand.
    absl::Status st = FromGrpcStatus(s);
    const bool retry = absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) || RefusedForJoinRate(st);
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
  sparse_->SetMember({});  // until this Join is done, the sparse calls have no session to send
  pb::JoinRequest request;
  request.set_rank(rank);
  request.set_world_size(world);
  request.set_status_address(status_address);
  int64_t offset = 0;
  for (const TensorSpec& s : specs) {
    SpecToProto(s, request.add_params());
    offset += s.num_elements();
  }
  // The values, when this worker has them, follow partition by partition (SendInitialValues):
  // no message holds the whole model.
  request.set_values_follow(initial != nullptr);
  request.set_takes_local_steps(takes_local_steps_);
  for (pb::EmbeddingTableSpec& table : sparse_->tables()) *request.add_tables() = std::move(table);
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
      AttachToken(token_.Current(), &ctx);
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
  info.backup_workers = response.backup_workers();
  info.sync_every = response.sync_every();
  data_deadline_ = call_deadline_ * std::max(1, info.sync_every);
  if (response.lease_seconds() > 0) info.lease = absl::Seconds(response.lease_seconds());
  info.live_ranks.assign(response.live_ranks().begin(), response.live_ranks().end());
  // Every shard's partitions, in offset order, must tile the model.
  std::vector<std::pair<PartitionRange, int>> held;
  for (int i = 0; i < k; ++i) {
    if (responses[i].sync_every() != response.sync_every() || responses[i].mode() != response.mode()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shards run different jobs: shard 0 (", shards_[0]->address, ") ", pb::Mode_Name(response.mode()),
          " with sync_every ", response.sync_every(), ", shard ", i, " (", shards_[i]->address, ") ",
          pb::Mode_Name(responses[i].mode()), " with sync_every ", responses[i].sync_every(),
          ": start every shard with the same --mode and --sync_every"));
    }
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
  backup_workers_ = info.mode == pb::MODE_SYNC ? info.backup_workers : 0;
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
  SparseCalls::Member member;
  member.rank = rank_;
  member.mode = mode_;
  member.deadline = data_deadline_;
  for (int i = 0; i < k; ++i) member.sessions.push_back(responses[i].session());
  sparse_->SetMember(std::move(member));
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
          requests_[i] = EncodeWithBytes(header, pb::InitializeRequest::kDataFieldNumber,
                                         BorrowedSlice(initial + p.offset, p.length * sizeof(float)));
          return {DataMethod::kInitialize, &requests_[i], &replies_[i], shard_of_[i]};
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

}  // namespace summa::worker
