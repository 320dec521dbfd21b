#include "common/rpc/wire.h"

#include "common/status_macros.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace summa {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::ArrayInputStream;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::ConcatenatingInputStream;
using google::protobuf::io::ZeroCopyInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

// Protobuf's own nesting limit (submessages and groups).
constexpr int kMaxDepth = 100;

// Reads tags, lengths and skipped fields as protobuf's parser does, so that a message means the
// same to the codec as to protobuf, and one that protobuf refuses is refused
// (fuzz/wire_fuzzer checks both against each other). CodedInputStream alone is laxer: it takes
// the low 32 bits of a tag or a length of any size.
class FieldReader {
 public:
  // `size`: the whole message's length in bytes.
  FieldReader(CodedInputStream& in, uint64_t size) : in_(in), size_(size) {}

  // The bytes left before the end of the message, or of the nested message being read.
  uint64_t left() const {
    const int until_limit = in_.BytesUntilLimit();  // -1: no nested limit
    return until_limit >= 0 ? until_limit : size_ - in_.CurrentPosition();
  }

  // A tag: at most five bytes, its value taken modulo 2^32; field number 0 is refused.
  absl::Status Tag(uint32_t* tag) {
    uint32_t v = 0;
    for (int i = 0; i < 5; ++i) {
      uint8_t b;
      if (!in_.ReadRaw(&b, 1)) return Malformed("a truncated tag");
      v |= static_cast<uint32_t>(b & 0x7f) << (7 * i);
      if (b < 0x80) {
        if (WireFormatLite::GetTagFieldNumber(v) == 0) return Malformed("field number 0");
        *tag = v;
        return absl::OkStatus();
      }
    }
    return Malformed("a tag longer than five bytes");
  }

  // A length: at most five bytes, below 2^31, and no more than the bytes left. A length is a
  // peer's claim: it is checked before anyone allocates for it.
  absl::Status Length(uint64_t* length) {
    uint64_t v = 0;
    for (int i = 0; i < 5; ++i) {
      uint8_t b;
      if (!in_.ReadRaw(&b, 1)) return Malformed("a truncated length");
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if (b < 0x80) {
        if (v >= (uint64_t{1} << 31) || v > left()) return Malformed("a field longer than the bytes that remain");
        *length = v;
        return absl::OkStatus();
      }
    }
    return Malformed("a length longer than five bytes");
  }

  // Copies the field that `tag` starts to `out`, as it came (groups whole).
  absl::Status Skip(uint32_t tag, int depth, CodedOutputStream& out) {
    out.WriteTag(tag);
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v;
        if (!in_.ReadVarint64(&v)) return Malformed("a bad varint");
        out.WriteVarint64(v);
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        uint64_t v;
        if (!in_.ReadLittleEndian64(&v)) return Malformed("a truncated field");
        out.WriteLittleEndian64(v);
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t v;
        if (!in_.ReadLittleEndian32(&v)) return Malformed("a truncated field");
        out.WriteLittleEndian32(v);
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        uint64_t length = 0;
        if (absl::Status s = Length(&length); !s.ok()) return s;
        std::string bytes;
        if (!in_.ReadString(&bytes, static_cast<int>(length))) return Malformed("a truncated field");
        out.WriteVarint32(static_cast<uint32_t>(length));
        out.WriteString(bytes);
        return absl::OkStatus();
      }
      case WireFormatLite::WIRETYPE_START_GROUP: {
        if (depth + 1 > kMaxDepth) return Malformed("groups nested too deep");
        for (;;) {
          uint32_t inner = 0;
          if (absl::Status s = Tag(&inner); !s.ok()) return s;
          if (WireFormatLite::GetTagWireType(inner) == WireFormatLite::WIRETYPE_END_GROUP) {
            if (WireFormatLite::GetTagFieldNumber(inner) != WireFormatLite::GetTagFieldNumber(tag)) {
              return Malformed("a group ended by another group's tag");
            }
            out.WriteTag(inner);
            return absl::OkStatus();
          }
          if (absl::Status s = Skip(inner, depth + 1, out); !s.ok()) return s;
        }
      }
      case WireFormatLite::WIRETYPE_END_GROUP:
        return Malformed("an end-group tag outside its group");
      default:
        return Malformed("an unknown wire type");
    }
  }

  CodedInputStream& in() { return in_; }

 private:
  CodedInputStream& in_;
  const uint64_t size_;
};

// Reads the fields up to the input's current limit, at nesting `depth`. The field path[0]
// (length-delimited) is the values (last in the path) or the message that holds them; every
// other field is copied, encoded as it came, to `out`.
absl::Status ParseFields(FieldReader& reader, int depth, absl::Span<const int> path,
                         const BytesDestination& destination, CodedOutputStream& out) {
  CodedInputStream& in = reader.in();
  while (reader.left() > 0) {
    uint32_t tag = 0;
    if (absl::Status s = reader.Tag(&tag); !s.ok()) return s;
    const bool ours = !path.empty() && WireFormatLite::GetTagFieldNumber(tag) == path[0] &&
                      WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!ours) {
      if (absl::Status s = reader.Skip(tag, depth, out); !s.ok()) return s;
      continue;
    }
    uint64_t length = 0;
    if (absl::Status s = reader.Length(&length); !s.ok()) return s;
    if (path.size() == 1) {
      absl::StatusOr<char*> to = destination(length);
      if (!to.ok()) return to.status();
      // No memory: the values stay where they are (ParseInPlace), and are only stepped over.
      const bool read = *to == nullptr ? in.Skip(static_cast<int>(length)) : in.ReadRaw(*to, static_cast<int>(length));
      if (!read) return Malformed("the values are cut short");
      continue;
    }
    if (depth + 1 > kMaxDepth) return Malformed("messages nested too deep");
    const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
    std::string inner;
    absl::Status s;
    {
      StringOutputStream inner_stream(&inner);
      CodedOutputStream inner_out(&inner_stream);
      s = ParseFields(reader, depth + 1, path.subspan(1), destination, inner_out);
    }
    if (!s.ok()) return s;
    in.PopLimit(limit);
    out.WriteTag(tag);
    out.WriteVarint32(static_cast<uint32_t>(inner.size()));
    out.WriteString(inner);
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// ParseWithBytes's work on a stream of `size` bytes.
absl::Status ParseStream(CodedInputStream& in, uint64_t size, absl::Span<const int> path,
                         const BytesDestination& destination, google::protobuf::MessageLite* header) {
  FieldReader fields(in, size);
  std::string rest;
  absl::Status s;
  {
    StringOutputStream rest_stream(&rest);
    CodedOutputStream out(&rest_stream);
    s = ParseFields(fields, 0, path, destination, out);
  }
  if (!s.ok()) return s;
  if (!header->ParseFromString(rest)) return Malformed("the fields around the values do not parse");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseWithBytes(const grpc::ByteBuffer& buffer, absl::Span<const int> path,
                            const BytesDestination& destination, google::protobuf::MessageLite* header) {
  // The reader only reads; it takes a mutable pointer for the C API underneath.
  grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(&buffer));
  CodedInputStream in(&reader);
  return ParseStream(in, buffer.Length(), path, destination, header);
}

absl::Status ParseInPlace(absl::string_view message, absl::Span<const int> path, absl::string_view* values,
                          google::protobuf::MessageLite* header) {
  if (message.size() > static_cast<size_t>(INT32_MAX)) return Malformed("a message over 2 GiB");
  CodedInputStream in(reinterpret_cast<const uint8_t*>(message.data()), static_cast<int>(message.size()));
  *values = absl::string_view();
  return ParseStream(
      in, message.size(), path,
      [&](uint64_t length) -> absl::StatusOr<char*> {
        // The values start where the stream stands (the field's tag and length just read).
        *values = message.substr(static_cast<size_t>(in.CurrentPosition()), length);
        return nullptr;
      },
      header);
}

absl::Status ParseInPlaceWithValues(absl::string_view prefix, absl::string_view values_there,
                                    absl::Span<const int> path, absl::string_view* values,
                                    google::protobuf::MessageLite* header) {
  if (prefix.size() + values_there.size() > static_cast<size_t>(INT32_MAX)) return Malformed("a message over 2 GiB");
  ArrayInputStream first(prefix.data(), static_cast<int>(prefix.size()));
  ArrayInputStream second(values_there.data(), static_cast<int>(values_there.size()));
  ZeroCopyInputStream* parts[2] = {&first, &second};
  ConcatenatingInputStream joined(parts, 2);
  CodedInputStream in(&joined);
  *values = absl::string_view();
  bool found = false;
  SUMMA_RETURN_IF_ERROR(ParseStream(
      in, prefix.size() + values_there.size(), path,
      [&](uint64_t length) -> absl::StatusOr<char*> {
        // Stepped over, never read: the values must be exactly the bytes elsewhere.
        if (found || static_cast<uint64_t>(in.CurrentPosition()) != prefix.size() || length != values_there.size()) {
          return Malformed("the values are not the bytes the request places elsewhere");
        }
        found = true;
        *values = values_there;
        return nullptr;
      },
      header));
  if (!found && !values_there.empty()) return Malformed("a message without values names values elsewhere");
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

grpc::ByteBuffer EncodeWithBytes(const google::protobuf::MessageLite& header, int field, grpc::Slice values) {
  std::string prefix = header.SerializeAsString();
  AppendFieldHeader(field, values.size(), &prefix);
  return TwoSlices(prefix, std::move(values));
}

grpc::ByteBuffer EncodeWithBytes(const google::protobuf::MessageLite& header, int field, grpc::Slice first,
                                 grpc::Slice second) {
  std::string prefix = header.SerializeAsString();
  AppendFieldHeader(field, first.size() + second.size(), &prefix);
  grpc::Slice slices[3] = {grpc::Slice(prefix), std::move(first), std::move(second)};
  return grpc::ByteBuffer(slices, 3);
}

grpc::ByteBuffer EncodeWithNestedBytes(const google::protobuf::MessageLite& outer, int outer_field,
                                       const google::protobuf::MessageLite& inner, int inner_field,
                                       grpc::Slice values) {
  std::string inner_prefix = inner.SerializeAsString();
  AppendFieldHeader(inner_field, values.size(), &inner_prefix);
  std::string prefix = outer.SerializeAsString();
  AppendFieldHeader(outer_field, inner_prefix.size() + values.size(), &prefix);
  prefix += inner_prefix;
  return TwoSlices(prefix, std::move(values));
}

grpc::Slice BorrowedSlice(const void* data, size_t bytes) {
  return grpc::Slice(data, bytes, grpc::Slice::STATIC_SLICE);
}

BytesDestination Exactly(char* out, uint64_t bytes, bool* got, std::string what) {
  return [=, what = std::move(what)](uint64_t length) -> absl::StatusOr<char*> {
    if (length != bytes) {
      return absl::DataLossError(absl::StrCat(what, " came back with ", length, " bytes, expected ", bytes));
    }
    *got = true;
    return out;
  };
}

}  // namespace summa
