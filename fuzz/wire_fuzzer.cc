// The wire codec (common/rpc/wire.h): ParseWithBytes over the fuzz input cut into slices (as gRPC's
// receive path hands a message over), and ParseInPlace over it whole (as the socket data plane
// hands it over), into the headers the server reads (PushRequest, InitializeRequest, PullRequest,
// AllReduceRequest), checked against protobuf parsing the same bytes whole: each accepts or
// refuses as protobuf does, and when they accept, the header and the values agree.
//
// Input: a FuzzedDataProvider's choice of message and cuts, then the message's bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "common/tensor_proto.h"
#include "common/rpc/wire.h"
#include "summa/v1/summa.pb.h"

namespace {

namespace pb = ::summa::v1;

void Check(bool ok, const char* what, const std::string& bytes) {
  if (!ok) {
    std::fprintf(stderr, "wire_fuzzer: %s (%zu message bytes)\n", what, bytes.size());
    std::abort();
  }
}

// `message` cut at `cuts` (ascending offsets) into slices.
grpc::ByteBuffer Sliced(const std::string& message, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t end : cuts) {
    slices.emplace_back(message.data() + begin, end - begin);
    begin = end;
  }
  slices.emplace_back(message.data() + begin, message.size() - begin);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Parses `buffer` as the server does, and `message` whole with protobuf, and compares. `Clear`
// removes the values from protobuf's message; `Values` reads them.
template <typename Message, typename Clear, typename Values>
void Compare(const grpc::ByteBuffer& buffer, const std::string& message, absl::Span<const int> path,
             Clear clear, Values values) {
  summa::Scratch scratch;
  Message header;
  const absl::Status ours = summa::ParseWithBytes(buffer, path, summa::IntoScratch(&scratch), &header);
  Message whole;
  const bool theirs = whole.ParseFromString(message);
  Check(ours.ok() == theirs, ours.ok() ? "accepted what protobuf refuses" : "refused what protobuf accepts",
        message);
  if (!theirs) {
    Message ignored;
    absl::string_view viewed;
    Check(!summa::ParseInPlace(message, path, &viewed, &ignored).ok(), "ParseInPlace accepted what protobuf refuses",
          message);
    return;
  }
  Check(scratch.view() == values(whole), "the values differ from protobuf's", message);
  Message in_place;
  absl::string_view viewed;
  const absl::Status whole_ours = summa::ParseInPlace(message, path, &viewed, &in_place);
  Check(whole_ours.ok(), "ParseInPlace refused what protobuf accepts", message);
  Check(viewed == values(whole), "ParseInPlace's values differ from protobuf's", message);
  Check(viewed.empty() || (viewed.data() >= message.data() && viewed.data() + viewed.size() <= message.data() + message.size()),
        "ParseInPlace's values are not inside the message", message);
  clear(whole);
  Check(header.SerializeAsString() == whole.SerializeAsString(), "the header differs from protobuf's", message);
  Check(in_place.SerializeAsString() == whole.SerializeAsString(), "ParseInPlace's header differs from protobuf's",
        message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int kind = in.ConsumeIntegralInRange(0, 3);
  std::vector<size_t> cuts(in.ConsumeIntegralInRange(0, 4));
  for (size_t& cut : cuts) cut = in.ConsumeIntegral<uint16_t>();
  const std::string message = in.ConsumeRemainingBytesAsString();
  for (size_t& cut : cuts) cut = message.empty() ? 0 : cut % (message.size() + 1);
  std::sort(cuts.begin(), cuts.end());
  const grpc::ByteBuffer buffer = Sliced(message, cuts);

  switch (kind) {
    case 0: {
      constexpr int kPath[] = {pb::PushRequest::kDataFieldNumber};
      Compare<pb::PushRequest>(
          buffer, message, kPath, [](pb::PushRequest& m) { m.clear_data(); },
          [](const pb::PushRequest& m) { return m.data(); });
      break;
    }
    case 1: {
      constexpr int kPath[] = {pb::InitializeRequest::kDataFieldNumber};
      Compare<pb::InitializeRequest>(
          buffer, message, kPath, [](pb::InitializeRequest& m) { m.clear_data(); },
          [](const pb::InitializeRequest& m) { return m.data(); });
      break;
    }
    case 2: {
      // A plain parse: no values field, the destination is never asked.
      Compare<pb::PullRequest>(
          buffer, message, {}, [](pb::PullRequest&) {}, [](const pb::PullRequest&) { return std::string(); });
      break;
    }
    default: {
      constexpr int kPath[] = {pb::AllReduceRequest::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};
      Compare<pb::AllReduceRequest>(
          buffer, message, kPath,
          [](pb::AllReduceRequest& m) {
            if (m.has_tensor()) m.mutable_tensor()->clear_data();
          },
          [](const pb::AllReduceRequest& m) { return m.tensor().data(); });
      // What the server does next with the header: the tensor's description.
      pb::AllReduceRequest whole;
      if (whole.ParseFromString(message)) summa::SpecFromProto(whole.tensor()).IgnoreError();
      break;
    }
  }
  return 0;
}
