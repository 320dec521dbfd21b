// The raw data path's codec: common/rpc/wire.h against protobuf's own encoding. The worker's
// ParameterClient on it against a real server is ps_client_test.cc's.
#include "common/rpc/wire.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "summa/v1/summa.pb.h"

namespace summa {
namespace {

namespace pb = ::summa::v1;

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// `encoded` cut into slices at the given offsets, as gRPC's receive path hands a message over.
grpc::ByteBuffer Sliced(const std::string& encoded, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  cuts.push_back(encoded.size());
  for (size_t end : cuts) {
    slices.emplace_back(encoded.data() + begin, end - begin);
    begin = end;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

pb::AllReduceRequest SampleRequest() {
  pb::AllReduceRequest r;
  r.set_name("loss");
  r.set_group_size(3);
  r.set_rank(2);
  r.set_round(7);
  r.mutable_tensor()->set_name("t");
  r.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
  r.mutable_tensor()->add_shape(5);
  r.mutable_tensor()->set_data(Bytes({1.5f, -2, 3, 4e20f, 5}));
  return r;
}

constexpr int kTensorData[] = {pb::AllReduceRequest::kTensorFieldNumber, pb::Tensor::kDataFieldNumber};

TEST(WireTest, TheValuesComeOutWholeAndEveryOtherFieldIntoTheHeader) {
  const pb::AllReduceRequest sent = SampleRequest();
  const std::string encoded = sent.SerializeAsString();
  // Cuts inside the tag, the nested header and the values (a float split across slices).
  grpc::ByteBuffer buffer = Sliced(encoded, {1, 9, encoded.size() - 7, encoded.size() - 1});
  Scratch values;
  pb::AllReduceRequest header;
  ASSERT_TRUE(ParseWithBytes(buffer, kTensorData, IntoScratch(&values), &header).ok());
  EXPECT_EQ(values.view(), sent.tensor().data());
  pb::AllReduceRequest expected = sent;
  expected.mutable_tensor()->clear_data();
  EXPECT_EQ(header.SerializeAsString(), expected.SerializeAsString());
}

TEST(WireTest, APrefixAndAValuesSliceAreTheMessageProtobufWouldEncode) {
  const pb::AllReduceRequest whole = SampleRequest();
  pb::Tensor tensor = whole.tensor();
  tensor.clear_data();
  const std::string& data = whole.tensor().data();
  std::string tensor_prefix = tensor.SerializeAsString();
  AppendFieldHeader(pb::Tensor::kDataFieldNumber, data.size(), &tensor_prefix);
  pb::AllReduceRequest outer = whole;
  outer.clear_tensor();
  std::string prefix = outer.SerializeAsString();
  AppendFieldHeader(pb::AllReduceRequest::kTensorFieldNumber, tensor_prefix.size() + data.size(), &prefix);
  prefix += tensor_prefix;
  const grpc::ByteBuffer b = TwoSlices(prefix, grpc::Slice(data));
  pb::AllReduceRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(b)));
  EXPECT_EQ(parsed.SerializeAsString(), whole.SerializeAsString());
}

TEST(WireTest, AMessageWhoseValuesLieElsewhereParsesAsTheWholeAndOnlyWithExactlyThoseBytes) {
  // A push as a client sends it: its fields, then the values field's tag and length, then the
  // values, which are elsewhere (another piece of memory).
  pb::PushRequest fields;
  fields.set_rank(1);
  fields.set_step(9);
  fields.set_partition(3);
  const std::string there = Bytes({1.5f, -2, 3, 4e20f, 5});
  std::string prefix = fields.SerializeAsString();
  AppendFieldHeader(pb::PushRequest::kDataFieldNumber, there.size(), &prefix);
  constexpr int kData[] = {pb::PushRequest::kDataFieldNumber};
  absl::string_view values;
  pb::PushRequest header;
  ASSERT_TRUE(ParseInPlaceWithValues(prefix, there, kData, &values, &header).ok());
  EXPECT_EQ(values.data(), there.data());  // not copied
  EXPECT_EQ(values.size(), there.size());
  EXPECT_EQ(header.SerializeAsString(), fields.SerializeAsString());
  // Nested (an AllReduce's tensor.data), built as the client builds it.
  pb::AllReduceRequest outer = SampleRequest();
  outer.clear_tensor();
  outer.clear_round();  // fields after the tensor would follow the values
  pb::Tensor tensor = SampleRequest().tensor();
  tensor.clear_data();
  std::string tensor_prefix = tensor.SerializeAsString();
  AppendFieldHeader(pb::Tensor::kDataFieldNumber, there.size(), &tensor_prefix);
  std::string nested = outer.SerializeAsString();
  AppendFieldHeader(pb::AllReduceRequest::kTensorFieldNumber, tensor_prefix.size() + there.size(), &nested);
  nested += tensor_prefix;
  pb::AllReduceRequest all_reduce;
  ASSERT_TRUE(ParseInPlaceWithValues(nested, there, kTensorData, &values, &all_reduce).ok());
  EXPECT_EQ(values.data(), there.data());
  EXPECT_EQ(all_reduce.tensor().shape(0), 5);
  // Bytes elsewhere that are not exactly the values field: one short, one over, the field cut
  // a byte later (its first value's byte in the prefix), and values for a message with none.
  EXPECT_FALSE(ParseInPlaceWithValues(prefix, there.substr(1), kData, &values, &header).ok());
  EXPECT_FALSE(ParseInPlaceWithValues(prefix, there + "x", kData, &values, &header).ok());
  EXPECT_FALSE(ParseInPlaceWithValues(prefix + there.substr(0, 1), there.substr(1), kData, &values, &header).ok());
  EXPECT_FALSE(ParseInPlaceWithValues(fields.SerializeAsString(), there, kData, &values, &header).ok());
}

TEST(WireTest, BadMessagesAreRefusedAndAbsentValuesNeverAskForMemory) {
  const std::string encoded = SampleRequest().SerializeAsString();
  Scratch values;
  pb::AllReduceRequest header;
  // Cut short inside the values.
  EXPECT_EQ(ParseWithBytes(Sliced(encoded.substr(0, encoded.size() - 3), {}), kTensorData,
                           IntoScratch(&values), &header).code(),
            absl::StatusCode::kInvalidArgument);
  // Field number 0 (tag 0x02: field 0, length-delimited).
  EXPECT_EQ(ParseWithBytes(Sliced(std::string("\x02\x01x", 3), {}), kTensorData, IntoScratch(&values), &header)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The destination's refusal is the parse's.
  auto refuse = [](uint64_t) -> absl::StatusOr<char*> { return absl::DataLossError("wrong length"); };
  EXPECT_EQ(ParseWithBytes(Sliced(encoded, {}), kTensorData, refuse, &header).code(),
            absl::StatusCode::kDataLoss);
  // No values field: the destination is not called.
  pb::AllReduceRequest bare = SampleRequest();
  bare.mutable_tensor()->clear_data();
  bool called = false;
  auto note = [&](uint64_t) -> absl::StatusOr<char*> {
    called = true;
    return absl::InternalError("unreachable");
  };
  EXPECT_TRUE(ParseWithBytes(Sliced(bare.SerializeAsString(), {}), kTensorData, note, &header).ok());
  EXPECT_FALSE(called);
  EXPECT_EQ(header.tensor().shape(0), 5);
}

// A values field whose length is past the message's end: the length was read as 32 bits and
// handed to the destination (IntoScratch allocated it), then cast to int for the copy, so ten
// bytes could make the server allocate 4 GiB and copy with a negative length.
TEST(WireTest, ALengthPastTheMessageIsRefusedBeforeAnyMemoryIsAskedFor) {
  uint64_t asked = 0;
  auto note = [&](uint64_t length) -> absl::StatusOr<char*> {
    asked = length;
    return absl::InternalError("unreachable");
  };
  constexpr int kPushData[] = {pb::PushRequest::kDataFieldNumber};
  pb::PushRequest header;
  // Field 6 (data), length-delimited, length 2^32 - 1, then three bytes.
  const std::string huge("\x32\xff\xff\xff\xff\x0f" "abc", 9);
  EXPECT_EQ(ParseWithBytes(Sliced(huge, {2}), kPushData, note, &header).code(),
            absl::StatusCode::kInvalidArgument);
  // Length 2^32 + 3: not 3, whatever its low 32 bits say.
  const std::string wide("\x32\x83\x80\x80\x80\x10" "abc", 9);
  EXPECT_EQ(ParseWithBytes(Sliced(wide, {}), kPushData, note, &header).code(),
            absl::StatusCode::kInvalidArgument);
  // A nested message longer than what remains: no limit is pushed past the end.
  const std::string nested("\x22\xff\xff\xff\xff\x07" "\x22\x01x", 9);
  pb::AllReduceRequest all_reduce;
  EXPECT_EQ(ParseWithBytes(Sliced(nested, {}), kTensorData, note, &all_reduce).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(asked, 0u);
  // The same fields with honest lengths parse.
  Scratch values;
  ASSERT_TRUE(ParseWithBytes(Sliced(std::string("\x32\x03" "abc", 5), {1}), kPushData, IntoScratch(&values),
                             &header).ok());
  EXPECT_EQ(values.view(), "abc");
}

// Found by fuzz/wire_fuzzer: CodedInputStream takes the low 32 bits of a tag or a length of any
// size, so the codec accepted messages that protobuf refuses (a ten-byte tag was taken for field
// 536870896). Tags and lengths are now read as protobuf's parser reads them.
TEST(WireTest, MessagesProtobufRefusesAreRefusedAndThoseItAcceptsAreReadAsItReadsThem) {
  constexpr int kPushData[] = {pb::PushRequest::kDataFieldNumber};
  struct Case {
    const char* what;
    std::string bytes;
    bool valid;
  };
  const Case cases[] = {
      {"a ten-byte tag", std::string("\x08\x01\x80\xff\xff\xff\xff\xff\xff\xff\xff\x01\x07", 13), false},
      {"a skipped field's six-byte length", std::string("\x7a\x83\x80\x80\x80\x80\x00" "abc", 10), false},
      {"a five-byte length of 2^31", std::string("\x7a\x80\x80\x80\x80\x08" "abc", 9), false},
      {"an end-group tag alone", std::string("\x08\x01\x7c", 3), false},
      {"a group ended by another field's tag", std::string("\x7b\x08\x01\x74", 4), false},
      {"an unknown group", std::string("\x7b\x08\x01\x7c\x32\x01x", 7), true},
      {"a two-byte length of 3", std::string("\x32\x83\x00" "abc", 6), true},
      {"a five-byte tag", std::string("\xb2\x80\x80\x80\x00\x01x", 7), true},
  };
  for (const Case& c : cases) {
    pb::PushRequest whole;
    ASSERT_EQ(whole.ParseFromString(c.bytes), c.valid) << c.what;
    Scratch values;
    pb::PushRequest header;
    const absl::Status parsed = ParseWithBytes(Sliced(c.bytes, {1}), kPushData, IntoScratch(&values), &header);
    if (!c.valid) {
      EXPECT_EQ(parsed.code(), absl::StatusCode::kInvalidArgument) << c.what;
      continue;
    }
    ASSERT_TRUE(parsed.ok()) << c.what << ": " << parsed;
    EXPECT_EQ(values.view(), whole.data()) << c.what;
    whole.clear_data();
    EXPECT_EQ(header.SerializeAsString(), whole.SerializeAsString()) << c.what;
  }
}

}  // namespace
}  // namespace summa
