// Messages with one large `bytes` field (a tensor's values) on the wire without protobuf's
// copies: the values travel as a slice of their own, and are read straight into their
// destination. The bytes are plain protobuf encoding, so a summa.v1 peer that parses the whole
// message with protobuf sees no difference (tensorflow's grpc_tensor_coding does the same).
//
// Reading: the values field, found by its path of field numbers (nested messages on the way),
// is copied once out of gRPC's receive slices into the caller's memory; every other field is
// parsed into a header message as usual. Writing: the header's encoding, then the values field's
// tag and length, then the values as a slice that gRPC sends without copying.
#ifndef SUMMA_COMMON_RPC_WIRE_H_
#define SUMMA_COMMON_RPC_WIRE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace summa {

// Where the values go: given the field's length in bytes, returns the memory to copy it to
// (exactly that many bytes), or an error that fails the parse (a length unlike the expected).
using BytesDestination = std::function<absl::StatusOr<char*>(uint64_t length)>;

// Parses `buffer` into `header`, except the bytes field at `path` (field numbers, outermost
// first; every one but the last a nested message), whose bytes go to `destination`. When the
// field is absent (or `path` is empty: a plain parse) the destination is never called. INVALID_ARGUMENT when the buffer is not a
// well-formed message.
absl::Status ParseWithBytes(const grpc::ByteBuffer& buffer, absl::Span<const int> path,
                            const BytesDestination& destination, google::protobuf::MessageLite* header);

// ParseWithBytes of a message held whole in one piece of memory, without the copy: `*values`
// views the values inside `message` (empty when absent), valid while `message` is.
absl::Status ParseInPlace(absl::string_view message, absl::Span<const int> path, absl::string_view* values,
                          google::protobuf::MessageLite* header);

// ParseInPlace of a message whose last bytes, its values (the bytes field at `path`, with
// nothing after it), lie elsewhere: `prefix` is the message up to them, ending with that field's
// tag and length, and `values_there` holds them. `*values` is `values_there`;
// INVALID_ARGUMENT when the message's values field is not exactly there.
absl::Status ParseInPlaceWithValues(absl::string_view prefix, absl::string_view values_there,
                                    absl::Span<const int> path, absl::string_view* values,
                                    google::protobuf::MessageLite* header);

// Bytes that grow without being zeroed first (a std::string's resize writes every new byte: a
// wasted pass over a partition) and keep their capacity across uses. Not thread-safe.
class Scratch {
 public:
  // Room for `size` bytes, their contents unspecified; reallocates only to grow.
  char* Resize(size_t size);
  void Clear() { size_ = 0; }
  // Gives the memory back.
  void Release();
  absl::string_view view() const { return absl::string_view(data_.get(), size_); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// A destination that resizes `scratch` to the field's length.
BytesDestination IntoScratch(Scratch* scratch);

// Encodes a length-delimited field's tag and length.
void AppendFieldHeader(int field, uint64_t length, std::string* out);

// A whole message, encoded by protobuf (for small messages).
grpc::ByteBuffer Encode(const google::protobuf::MessageLite& message);

// `prefix` (the encoded fields before the values, ending in the values field's header) and then
// `values`, as one message of two slices.
grpc::ByteBuffer TwoSlices(const std::string& prefix, grpc::Slice values);

// The writing side of the one codec, for both ends of the data path:
// `header` with its bytes field `field` holding `values`, which go as they are (one message of
// two slices). `header`'s own `field` must be empty.
grpc::ByteBuffer EncodeWithBytes(const google::protobuf::MessageLite& header, int field, grpc::Slice values);
// The same with the bytes field in two parts, `first` then `second`, each sent as it is (a
// sparse push's ids, then its rows).
grpc::ByteBuffer EncodeWithBytes(const google::protobuf::MessageLite& header, int field, grpc::Slice first,
                                 grpc::Slice second);
// The same one message down: `outer` with its message field `outer_field` holding `inner`, whose
// bytes field `inner_field` holds `values` (AllReduce's tensor).
grpc::ByteBuffer EncodeWithNestedBytes(const google::protobuf::MessageLite& outer, int outer_field,
                                       const google::protobuf::MessageLite& inner, int inner_field,
                                       grpc::Slice values);
// A slice over `bytes` bytes at `data`, memory that outlives the call that sends it: sent
// without a copy.
grpc::Slice BorrowedSlice(const void* data, size_t bytes);
// A destination for exactly `bytes` bytes at `out` that sets `*got` when used; DATA_LOSS naming
// `what` for any other length.
BytesDestination Exactly(char* out, uint64_t bytes, bool* got, std::string what);

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_WIRE_H_
