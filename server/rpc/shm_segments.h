// ShmSegments: one shared-memory plane connection's memory (common/rpc/socket_frame.h has the
// frames): the worker's request segment, mapped read-only, whose requests the data-path handlers
// read in place (they sum straight out of it), and the connection's reply segment, which the
// worker maps read-only and reads its replies out of; and the references the last reply holds on
// the published snapshot segments it named (server/core/snapshot.h), until the worker's next
// request or release. The socket plane's connection (server/rpc/socket_plane.cc) owns one and
// uses it from its thread alone. Not thread-safe.
#ifndef SUMMA_SERVER_RPC_SHM_SEGMENTS_H_
#define SUMMA_SERVER_RPC_SHM_SEGMENTS_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/socket_frame.h"
#include "common/shared_segment.h"
#include "grpcpp/support/byte_buffer.h"

namespace summa::server {

class ShmSegments {
 public:
  // The attach on `fd` (a Unix connection whose hello passed): the worker's request segment
  // taken and checked (a memfd of ordinary pages, sealed against shrinking, its declared size, at
  // most `max_message_bytes` and a lead), the reply segment made (at most as large) and sent
  // read-only with `instance`. A segment refused is `*refusal`, for the caller to answer with
  // (then the result is OK and attached() false); a failure to read or write is the result.
  absl::Status Attach(int fd, int64_t max_message_bytes, uint64_t instance, absl::Time deadline,
                      absl::Status* refusal);
  bool attached() const { return requests_.valid(); }

  // The request a header with kInSegment names, in the request segment; INVALID_ARGUMENT when
  // it lies outside.
  absl::StatusOr<absl::Span<char>> Request(const socket_plane::RequestHeader& header) const;

  // Takes the values segment a kAttachValues frame carried (`fd`, taken over; -1 if none came):
  // of `bytes`, at most `max_bytes`, checked as the request segment is and mapped read-only. It
  // replaces the last one. INVALID_ARGUMENT saying what is wrong (the old one then stays).
  absl::Status AttachValues(int fd, uint64_t bytes, uint64_t max_bytes);
  // The values a kValuesElsewhere request names: `place` is the request's first
  // kValuesPlaceBytes (offset and length, read once here). INVALID_ARGUMENT when there is no
  // values segment, or they lie outside it or off a 4-byte boundary.
  absl::StatusOr<absl::string_view> Values(absl::Span<const char> place) const;

  // The worker is done with the last reply (its next request came, or a release): the published
  // buffers it named may be reused.
  void ReleaseReply() { held_.Clear(); }

  // Writes an OK reply on `fd`: values that lie in a published segment are named, not copied,
  // and held until ReleaseReply; the rest is copied into the reply segment, which the worker read
  // the last reply out of before it sent this call. Only the header (and the pieces) go on the
  // socket. Nothing when the reply does not fit: it goes on the socket as on the TCP plane.
  // `*counted` is incremented before the reply is written (a worker that has it sees it counted).
  std::optional<absl::Status> Reply(int fd, const grpc::ByteBuffer& response, absl::Time deadline,
                                    std::atomic<uint64_t>* counted);

 private:
  SharedSegment values_;  // the worker's flat buffer of values (kAttachValues), read-only
  struct Piece {
    uint64_t segment;
    uint64_t offset;
    uint64_t length;
    uint64_t segment_bytes;
  };

  SharedSegment requests_;
  SharedSegment replies_;
  grpc::ByteBuffer held_;  // the last reply, while it names published segments
  // Reply's, kept across replies.
  std::vector<grpc::Slice> slices_;
  std::vector<Piece> pieces_;
  std::vector<int> published_fds_;  // Not owned: the snapshots' own descriptors.
  std::string frame_;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_SHM_SEGMENTS_H_
