#include "server/rpc/shm_segments.h"

#include <sys/uio.h>

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/core/snapshot.h"

namespace summa::server {

absl::Status ShmSegments::Attach(int fd, int64_t max_message_bytes, uint64_t instance, absl::Time deadline,
                                 absl::Status* refusal) {
  *refusal = absl::OkStatus();
  char attach[socket_plane::kAttachBytes];
  socket_plane::OwnedFd segment;
  SUMMA_RETURN_IF_ERROR(socket_plane::ReceiveWithFd(fd, attach, sizeof(attach), &segment, deadline, "the attach"));
  uint64_t request_bytes, reply_bytes;
  std::memcpy(&request_bytes, attach, 8);
  std::memcpy(&reply_bytes, attach + 8, 8);
  if (!segment.valid()) {
    *refusal = absl::InvalidArgumentError("the attach carried no request segment (a memfd, sent with SCM_RIGHTS)");
    return absl::OkStatus();
  }
  // No request is longer than --max_message_bytes (and its lead): neither is a segment.
  const uint64_t page = SharedSegment::PageBytes();
  const uint64_t most = (static_cast<uint64_t>(max_message_bytes) + socket_plane::kMaxLead + page - 1) / page * page;
  const std::string limit = absl::StrCat(" (summa-server --max_message_bytes=", max_message_bytes, ")");
  // Read-only: the server never writes the worker's memory (the handlers copy values off a
  // 4-byte boundary instead of moving them there).
  absl::StatusOr<SharedSegment> requests = SharedSegment::Adopt(segment.release(), request_bytes, most,
                                                                SharedSegment::Access::kReadOnly, "the request segment");
  if (!requests.ok()) {
    const absl::string_view why = requests.status().message();
    *refusal = absl::Status(requests.status().code(), absl::StrCat(why, absl::StrContains(why, "larger") ? limit : ""));
    return absl::OkStatus();
  }
  if (reply_bytes == 0 || reply_bytes > most) {
    *refusal = absl::InvalidArgumentError(
        absl::StrCat("a reply segment of ", reply_bytes, " bytes asked for: from 1 to ", most, limit));
    return absl::OkStatus();
  }
  absl::StatusOr<SharedSegment> replies = SharedSegment::Create("summa-replies", reply_bytes, /*writable_by_others=*/false);
  absl::StatusOr<int> read_only = replies.ok() ? replies->ReadOnlyDescriptor() : replies.status();
  if (!read_only.ok()) {
    *refusal = read_only.status();
    return absl::OkStatus();
  }
  const socket_plane::OwnedFd sent(*read_only);
  char answer[socket_plane::kHeaderBytes + socket_plane::kAttachBytes];
  socket_plane::ReplyHeader header;
  header.length = socket_plane::kAttachBytes;
  socket_plane::EncodeReplyHeader(header, answer);
  const uint64_t size = replies->size();
  std::memcpy(answer + socket_plane::kHeaderBytes, &size, 8);
  std::memcpy(answer + socket_plane::kHeaderBytes + 8, &instance, 8);
  SUMMA_RETURN_IF_ERROR(socket_plane::SendWithFd(fd, answer, sizeof(answer), sent.get(), deadline, "the attach's answer"));
  replies->CloseDescriptor();  // sent once; the mapping stays
  requests_ = *std::move(requests);
  replies_ = *std::move(replies);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<char>> ShmSegments::Request(const socket_plane::RequestHeader& header) const {
  // (Both are at most what a frame carries: lead a u32, length a u64 checked against
  // --max_message_bytes first; their sum cannot wrap.)
  if (header.length > requests_.size() || header.lead > requests_.size() - header.length) {
    return absl::InvalidArgumentError(absl::StrCat("a request at bytes [", header.lead, ", ",
                                                   uint64_t{header.lead} + header.length,
                                                   ") of a request segment of ", requests_.size()));
  }
  return absl::Span<char>(requests_.data() + header.lead, header.length);
}

absl::Status ShmSegments::AttachValues(int fd, uint64_t bytes, uint64_t max_bytes) {
  if (fd < 0) return absl::InvalidArgumentError("the values segment's frame carried no memfd (SCM_RIGHTS)");
  SUMMA_ASSIGN_OR_RETURN(values_, SharedSegment::Adopt(fd, bytes, max_bytes, SharedSegment::Access::kReadOnly,
                                                       "the values segment"));
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> ShmSegments::Values(absl::Span<const char> place) const {
  if (!values_.valid()) return absl::InvalidArgumentError("a request names values in a values segment it never sent");
  uint64_t offset, length;
  std::memcpy(&offset, place.data(), 8);  // once: the worker may write its segment meanwhile
  std::memcpy(&length, place.data() + 8, 8);
  if (length > values_.size() || offset > values_.size() - length || offset % alignof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("values at bytes [", offset, ", +", length,
                                                   ") of a values segment of ", values_.size()));
  }
  return absl::string_view(values_.data() + offset, length);
}

std::optional<absl::Status> ShmSegments::Reply(int fd, const grpc::ByteBuffer& response, absl::Time deadline,
                                               std::atomic<uint64_t>* counted) {
  (void)response.Dump(&slices_);
  pieces_.clear();
  published_fds_.clear();
  uint64_t at = 0;
  for (const grpc::Slice& s : slices_) {
    if (s.size() == 0) continue;
    Snapshot::SharedView shared;
    if (s.size() >= static_cast<size_t>(Snapshot::kSharedBytes) && pieces_.size() < socket_plane::kMaxPieces &&
        Snapshot::FindShared(s.begin(), s.size(), &shared)) {
      pieces_.push_back({shared.id, shared.offset, s.size(), shared.segment_bytes});
      published_fds_.push_back(shared.fd);
      continue;
    }
    if (at + s.size() > replies_.size() || pieces_.size() >= socket_plane::kMaxPieces) {
      slices_.clear();
      return std::nullopt;
    }
    std::memcpy(replies_.data() + at, s.begin(), s.size());
    if (!pieces_.empty() && pieces_.back().segment == 0 && pieces_.back().offset + pieces_.back().length == at) {
      pieces_.back().length += s.size();
    } else {
      pieces_.push_back({0, at, s.size(), replies_.size()});
    }
    at += s.size();
  }
  slices_.clear();
  counted->fetch_add(1, std::memory_order_relaxed);
  socket_plane::ReplyHeader header;
  header.code = socket_plane::kInSegment;  // and OK
  header.length = response.Length();
  if (published_fds_.empty()) {  // the whole message at [0, length) of the reply segment
    char head[socket_plane::kHeaderBytes];
    socket_plane::EncodeReplyHeader(header, head);
    iovec iov = {head, sizeof(head)};
    return socket_plane::WriteFull(fd, &iov, 1, deadline, "a reply");
  }
  header.code |= socket_plane::kPieces;
  frame_.resize(socket_plane::kHeaderBytes + 8 + pieces_.size() * socket_plane::kPieceBytes);
  socket_plane::EncodeReplyHeader(header, frame_.data());
  char* out = frame_.data() + socket_plane::kHeaderBytes;
  const uint32_t count = static_cast<uint32_t>(pieces_.size()), zero = 0;
  std::memcpy(out, &count, 4);
  std::memcpy(out + 4, &zero, 4);
  out += 8;
  for (const Piece& p : pieces_) {
    for (uint64_t v : {p.segment, p.offset, p.length, p.segment_bytes}) {
      std::memcpy(out, &v, 8);
      out += 8;
    }
  }
  held_ = response;  // the snapshots' references, until the next request
  return socket_plane::SendWithFds(fd, frame_.data(), frame_.size(), published_fds_, deadline, "a reply");
}

}  // namespace summa::server
