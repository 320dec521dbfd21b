#include "common/wire.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace summa {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

// Reads the fields up to the input's current limit. The field path[0] (length-delimited) is
// the values (last in the path) or the message that holds them; every other field is copied,
// encoded as it came, to `out`. `size` is the whole message's length in bytes.
absl::Status ParseFields(CodedInputStream& in, uint64_t size, absl::Span<const int> path,
                         const BytesDestination& destination, CodedOutputStream& out) {
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      return in.ConsumedEntireMessage() ? absl::OkStatus() : Malformed("a bad tag or a truncated field");
    }
    if (WireFormatLite::GetTagFieldNumber(tag) == 0) return Malformed("field number 0");
    const bool ours = !path.empty() && WireFormatLite::GetTagFieldNumber(tag) == path[0] &&
                      WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!ours) {
      if (!WireFormatLite::SkipField(&in, tag, &out)) return Malformed("a truncated field");
      continue;
    }
    // A length is a peer's claim: one past the bytes that remain is refused before the
    // destination allocates for it (and before a length over 2^31 reaches an int).
    uint64_t length;
    if (!in.ReadVarint64(&length)) return Malformed("a truncated length");
    const int until_limit = in.BytesUntilLimit();  // -1: no nested limit
    const uint64_t left = until_limit >= 0 ? until_limit : size - in.CurrentPosition();
    if (length > left) return Malformed("a field longer than the bytes that remain");
    if (path.size() == 1) {
      absl::StatusOr<char*> to = destination(length);
      if (!to.ok()) return to.status();
      if (!in.ReadRaw(*to, static_cast<int>(length))) return Malformed("the values are cut short");
      continue;
    }
    const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
    std::string inner;
    absl::Status s;
    {
      StringOutputStream inner_stream(&inner);
      CodedOutputStream inner_out(&inner_stream);
      s = ParseFields(in, size, path.subspan(1), destination, inner_out);
    }
    if (!s.ok()) return s;
    in.PopLimit(limit);
    out.WriteTag(tag);
    out.WriteVarint32(static_cast<uint32_t>(inner.size()));
    out.WriteString(inner);
  }
}

}  // namespace

absl::Status ParseWithBytes(const grpc::ByteBuffer& buffer, absl::Span<const int> path,
                            const BytesDestination& destination, google::protobuf::MessageLite* header) {
  // The reader only reads; it takes a mutable pointer for the C API underneath.
  grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(&buffer));
  CodedInputStream in(&reader);
  std::string rest;
  absl::Status s;
  {
    StringOutputStream rest_stream(&rest);
    CodedOutputStream out(&rest_stream);
    s = ParseFields(in, buffer.Length(), path, destination, out);
  }
  if (!s.ok()) return s;
  if (!header->ParseFromString(rest)) return Malformed("the fields around the values do not parse");
  return absl::OkStatus();
}

char* Scratch::Resize(size_t size) {
  if (size > capacity_) {
    data_.reset(new char[size]);  // uninitialised: the caller writes every byte
    capacity_ = size;
  }
  size_ = size;
  return data_.get();
}

void Scratch::Release() {
  data_.reset();
  size_ = capacity_ = 0;
}

BytesDestination IntoScratch(Scratch* scratch) {
  return [scratch](uint64_t length) -> absl::StatusOr<char*> { return scratch->Resize(length); };
}

void AppendFieldHeader(int field, uint64_t length, std::string* out) {
  StringOutputStream stream(out);
  CodedOutputStream coded(&stream);
  coded.WriteTag(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  coded.WriteVarint64(length);
}

grpc::ByteBuffer Encode(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer TwoSlices(const std::string& prefix, grpc::Slice values) {
  grpc::Slice slices[2] = {grpc::Slice(prefix), std::move(values)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace summa
