// ParameterClient: the AllReduce, its tensors cut into chunks over the shards. The rest is
// client/ps_client.cc.
#include "client/ps_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/wire.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/tensor_proto.h"

namespace summa::worker {

namespace pb = ::summa::v1;

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
  if (allreduce_replies_.size() < chunks) {
    allreduce_requests_.resize(chunks);
    allreduce_replies_.resize(chunks);
  }
  std::vector<grpc::ByteBuffer>& requests = allreduce_requests_;
  std::vector<grpc::ByteBuffer>& replies = allreduce_replies_;
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
        SpecToProto({outer.name(), DType::kFloat32, {count}}, &tensor);
        requests[k] = EncodeWithNestedBytes(outer, pb::AllReduceRequest::kTensorFieldNumber, tensor,
                                            pb::Tensor::kDataFieldNumber,
                                            BorrowedSlice(values.data() + begin, count * sizeof(float)));
        return {DataMethod::kAllReduce, &requests[k], &replies[k], plan.Shard(static_cast<int64_t>(k)), group.timeout};
      },
      [&](size_t k) { return absl::StrCat("AllReduce '", name(k), "'"); }, "allreduce"));
  for (size_t k = 0; k < chunks; ++k) {
    const auto [begin, count] = range(k);
    constexpr int kDataPath[] = {pb::AllReduceResponse::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};
    bool got = false;
    pb::AllReduceResponse header;
    SUMMA_RETURN_IF_ERROR(ParseWithBytes(
        replies[k], kDataPath,
        Exactly(reinterpret_cast<char*>(sum.data() + begin), count * sizeof(float), &got,
                absl::StrCat("AllReduce '", name(k), "'")),
        &header));
    replies[k].Clear();
    requests[k].Clear();
    if (!got) return absl::DataLossError(absl::StrCat("AllReduce '", name(k), "' came back without values"));
  }
  return absl::OkStatus();
}

}  // namespace summa::worker
