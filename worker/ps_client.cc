#include "worker/ps_client.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/server_builder.h"
#include "common/status_macros.h"

namespace summa::worker {

namespace pb = ::summa::v1;

ParameterClient::ParameterClient(const std::string& address, absl::Duration call_deadline,
                                 absl::Duration join_deadline)
    : address_(address), call_deadline_(call_deadline), join_deadline_(join_deadline) {
  stub_ = pb::ParameterServer::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), DefaultChannelArguments()));
}

std::unique_ptr<grpc::ClientContext> ParameterClient::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_deadline_));
  return ctx;
}

absl::StatusOr<JoinInfo> ParameterClient::Join(int rank, int world,
                                               const std::vector<TensorSpec>& specs,
                                               const float* initial,
                                               const std::string& status_address) {
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
    if (initial != nullptr) {
      t->set_data(reinterpret_cast<const char*>(initial + offset), s.num_bytes());
    }
    offset += s.num_elements();
  }
  const absl::Time give_up = absl::Now() + join_deadline_;
  absl::Duration backoff = absl::Milliseconds(50);
  pb::JoinResponse response;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(10))));
    grpc::Status s = stub_->Join(&ctx, request, &response);
    if (s.ok()) break;
    const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || absl::Now() + backoff >= give_up) {
      absl::Status st = FromGrpcStatus(s);
      return absl::Status(st.code(), absl::StrCat("join ", address_, " as rank ", rank, " failed after ",
                                                  attempt, " attempts: ", st.message()));
    }
    if (attempt == 1 || attempt % 20 == 0) {
      SUMMA_LOG(INFO) << "waiting for the server at " << address_ << ": " << s.error_message();
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  JoinInfo info;
  info.rank = response.rank();
  info.version = response.version();
  info.next_step = response.next_step();
  info.mode = response.mode();
  info.staleness = response.staleness();
  if (response.lease_seconds() > 0) info.lease = absl::Seconds(response.lease_seconds());
  info.live_ranks.assign(response.live_ranks().begin(), response.live_ranks().end());
  int64_t expected = 0;
  for (const pb::Partition& p : response.partitions()) {
    if (p.offset() != expected || p.length() <= 0) {
      return absl::InternalError(absl::StrCat("the server's partition ", p.id(), " at offset ",
                                              p.offset(), " does not tile the model"));
    }
    expected += p.length();
    info.partitions.push_back({p.id(), p.offset(), p.length()});
  }
  if (expected != offset) {
    return absl::FailedPreconditionError(absl::StrCat("the server's partitions cover ", expected,
                                                      " parameters; this worker's model has ", offset));
  }
  rank_ = info.rank;
  mode_ = info.mode;
  partitions_ = info.partitions;
  push_requests_.assign(partitions_.size(), pb::PushRequest());
  pull_requests_.assign(partitions_.size(), pb::PullRequest());
  responses_.assign(partitions_.size(), pb::PullResponse());
  for (size_t i = 0; i < partitions_.size(); ++i) {
    push_requests_[i].set_rank(rank_);
    push_requests_[i].set_partition(partitions_[i].id);
    push_requests_[i].set_dtype(pb::DTYPE_FLOAT32);
    pull_requests_[i].set_rank(rank_);
    pull_requests_[i].set_partition(partitions_[i].id);
  }
  return info;
}

template <typename Start>
absl::Status ParameterClient::ForEachPartition(Start start) {
  // Shared with the callbacks, which may still be leaving the lock when the wait below returns.
  struct Pending {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu);
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  pending->left = partitions_.size();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (size_t i = 0; i < partitions_.size(); ++i) contexts.push_back(NewContext());
  for (size_t i = 0; i < partitions_.size(); ++i) {
    start(i, contexts[i].get(), [pending, id = partitions_[i].id](grpc::Status s) {
      absl::MutexLock lock(&pending->mu);
      if (!s.ok() && pending->first_error.ok()) {
        absl::Status st = FromGrpcStatus(s);
        pending->first_error = absl::Status(st.code(), absl::StrCat("partition ", id, ": ", st.message()));
      }
      --pending->left;
    });
  }
  absl::MutexLock lock(&pending->mu);
  pending->mu.Await(absl::Condition(
      +[](size_t* left) { return *left == 0; }, &pending->left));
  return pending->first_error;
}

absl::Status ParameterClient::CopyOut(const pb::PullResponse& r, const PartitionRange& p,
                                      float* weights) {
  if (static_cast<int64_t>(r.data().size()) != p.length * 4) {
    return absl::DataLossError(absl::StrCat("partition ", p.id, " came back with ", r.data().size(),
                                            " bytes, expected ", p.length * 4));
  }
  std::memcpy(weights + p.offset, r.data().data(), r.data().size());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParameterClient::PullAll(uint64_t min_version, float* weights) {
  if (rank_ < 0) return absl::FailedPreconditionError("PullAll before Join");
  SUMMA_RETURN_IF_ERROR(ForEachPartition([&](size_t i, grpc::ClientContext* ctx, auto done) {
    pull_requests_[i].set_min_version(min_version);
    stub_->async()->Pull(ctx, &pull_requests_[i], &responses_[i], std::move(done));
  }));
  uint64_t version = UINT64_MAX;
  for (size_t i = 0; i < partitions_.size(); ++i) {
    SUMMA_RETURN_IF_ERROR(CopyOut(responses_[i], partitions_[i], weights));
    version = std::min(version, responses_[i].version());
  }
  return version;
}

const pb::PushRequest& ParameterClient::PushRequestFor(size_t i, uint64_t step, int64_t num_examples,
                                                      const float* gradients) {
  const PartitionRange& p = partitions_[i];
  pb::PushRequest& req = push_requests_[i];
  req.set_step(step);
  req.set_num_examples(num_examples);
  req.mutable_data()->assign(reinterpret_cast<const char*>(gradients + p.offset), p.length * 4);
  return req;
}

absl::Status ParameterClient::PushPull(uint64_t step, int64_t num_examples, const float* gradients,
                                       float* weights, std::vector<int>* live_ranks) {
  if (rank_ < 0) return absl::FailedPreconditionError("PushPull before Join");
  SUMMA_RETURN_IF_ERROR(ForEachPartition([&](size_t i, grpc::ClientContext* ctx, auto done) {
    stub_->async()->PushPull(ctx, &PushRequestFor(i, step, num_examples, gradients), &responses_[i],
                             std::move(done));
  }));
  for (size_t i = 0; i < partitions_.size(); ++i) {
    if (mode_ == pb::MODE_SYNC && responses_[i].version() != step + 1) {
      return absl::InternalError(absl::StrCat("asked for version ", step + 1, " of partition ",
                                              partitions_[i].id, ", got ", responses_[i].version()));
    }
    SUMMA_RETURN_IF_ERROR(CopyOut(responses_[i], partitions_[i], weights));
  }
  if (live_ranks != nullptr && !responses_.empty()) {
    live_ranks->assign(responses_[0].live_ranks().begin(), responses_[0].live_ranks().end());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterClient::Push(uint64_t step, int64_t num_examples,
                                           const float* gradients) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Join");
  std::vector<pb::PushResponse> replies(partitions_.size());
  SUMMA_RETURN_IF_ERROR(ForEachPartition([&](size_t i, grpc::ClientContext* ctx, auto done) {
    stub_->async()->Push(ctx, &PushRequestFor(i, step, num_examples, gradients), &replies[i],
                         std::move(done));
  }));
  return std::all_of(replies.begin(), replies.end(),
                     [](const pb::PushResponse& r) { return r.completed_step(); });
}

absl::Status ParameterClient::Heartbeat(int rank) const {
  pb::HeartbeatRequest request;
  request.set_rank(rank);
  pb::HeartbeatResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response));
}

absl::Status ParameterClient::Leave(int rank) {
  pb::LeaveRequest request;
  request.set_rank(rank);
  pb::LeaveResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return FromGrpcStatus(stub_->Leave(&ctx, request, &response));
}

absl::StatusOr<std::vector<float>> ParameterClient::AllReduce(const Collective& group,
                                                              const std::vector<float>& values) {
  pb::AllReduceRequest request;
  request.set_name(group.name);
  request.set_group_size(group.group_size);
  request.set_rank(group.rank);
  request.set_members(group.members);
  request.set_round(group.round);
  pb::Tensor* t = request.mutable_tensor();
  t->set_name(group.name);
  t->set_dtype(pb::DTYPE_FLOAT32);
  t->add_shape(static_cast<int64_t>(values.size()));
  t->set_data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  pb::AllReduceResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = NewContext();
  grpc::Status s = stub_->AllReduce(ctx.get(), request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  if (response.tensor().data().size() != values.size() * 4) {
    return absl::DataLossError("AllReduce returned a tensor of the wrong size");
  }
  std::vector<float> sum(values.size());
  std::memcpy(sum.data(), response.tensor().data().data(), values.size() * 4);
  return sum;
}

}  // namespace summa::worker
