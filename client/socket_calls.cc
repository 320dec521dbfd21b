#include "client/socket_calls.h"

#include <poll.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_set.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"

namespace summa::worker {

using socket_plane::kHeaderBytes;

namespace {

// How errors name a shard's plane.
std::string Where(const SocketCalls::Endpoint& e) {
  return e.shm_socket.empty() ? absl::StrCat("the data plane at ", e.host, ":", e.port)
                              : absl::StrCat("the shared-memory plane at ", e.shm_socket);
}

// A refusal's status, its message read from `link` after its header `answer`.
absl::Status ReadRefusal(socket_plane::Link& link, const socket_plane::ReplyHeader& answer, absl::Time deadline) {
  std::string message(std::min(answer.message_length, socket_plane::kMaxStatusMessageBytes), '\0');
  link.ReadFull(message.data(), message.size(), deadline, "a refusal").IgnoreError();
  return absl::Status(static_cast<absl::StatusCode>(answer.code), message);
}

}  // namespace

struct SocketCalls::Connection {
  socket_plane::Link link;  // the socket, and TLS over it
  short wait = 0;           // what the link last said it waits for (TLS may read to write)
  int shard = 0;
  bool busy = false;
  size_t tag = 0;
  // kQueued: its request waits for its shard's calls started earlier to go out (Begin). kDrain:
  // its request is written, and the next one waits until the peer has most of it (the socket's
  // unacknowledged bytes at most kMaxUnackedBytes) or the reply comes.
  enum class Stage { kQueued, kSend, kDrain, kHead, kMessage, kPieceCount, kPieces, kBody } stage = Stage::kSend;
  char request_head[kHeaderBytes];
  std::vector<grpc::Slice> slices;  // the request's, while it is sent
  std::vector<iovec> iov;
  size_t iov_at = 0;
  bool request_cut = false;  // the reply came before the whole request went out
  bool counted = false;      // its request's sending counts in its shard's sending_
  const SharedSegment* values = nullptr;  // the values segment the server has of this connection
  char reply_head[kHeaderBytes];
  socket_plane::ReplyHeader reply;
  std::string message;
  char* body = nullptr;
  uint64_t got = 0;  // bytes of the current part received
  // The shared-memory plane's (Attach): this connection's requests and the server's replies.
  SharedSegment requests;
  SharedSegment replies;
  bool reply_in_segment = false;  // the reply being read is in `replies`
  bool reply_pieces = false;      // ... and in the server's published segments
  char piece_count[8];
  std::string pieces;              // the reply's list (common/rpc/socket_frame.h)
  std::vector<socket_plane::OwnedFd> passed;  // descriptors the server sent beside the reply
  std::vector<grpc::Slice> reply_slices;
  std::vector<uint64_t> reply_segments;  // the published segments the held reply names
  static constexpr size_t kNoTag = ~size_t{0};
  size_t reply_owner = kNoTag;  // the tag whose reply `replies` holds
};

SocketCalls::SocketCalls(std::vector<Endpoint> shards, std::string authorization, socket_plane::TlsContext* tls,
                         uint64_t segment_bytes)
    : shards_(std::move(shards)),
      authorization_(std::move(authorization)),
      tls_(tls),
      segment_bytes_(segment_bytes),
      published_(shards_.size()),
      values_refused_(shards_.size(), 0),
      sending_(shards_.size(), 0),
      send_queue_(shards_.size()),
      caps_(shards_.size(), kMaxConnectionsPerShard),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

void SocketCalls::Wake() {
  const uint64_t one = 1;
  // A full counter (never, in practice) is already a pending wake.
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

SocketCalls::~SocketCalls() = default;

bool SocketCalls::shm() const {
  return !shards_.empty() &&
         std::all_of(shards_.begin(), shards_.end(), [](const Endpoint& e) { return !e.shm_socket.empty(); });
}

absl::Status SocketCalls::Open(int shard, absl::Time deadline) {
  absl::Duration backoff = kFirstHelloBackoff;
  for (int attempt = 1;; ++attempt) {
    bool connected = false;
    absl::Status opened = OpenOnce(shard, deadline, &connected);
    // A connection closed before its hello's answer came was, most likely, evicted by a server
    // flooded with connections that never say their hello (server/rpc/socket_plane.h): a new one
    // soon gets through. An answer (a refusal) or a plane that cannot be reached is final.
    if (opened.ok() || !connected || !absl::IsUnavailable(opened) || attempt == kHelloAttempts ||
        absl::Now() + backoff >= deadline) {
      return opened;
    }
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

absl::Status SocketCalls::OpenOnce(int shard, absl::Time deadline, bool* connected) {
  const Endpoint& e = shards_[shard];
  const bool shm = !e.shm_socket.empty();
  absl::StatusOr<socket_plane::OwnedFd> fd =
      shm ? socket_plane::ConnectUnix(e.shm_socket, deadline) : socket_plane::Connect(e.host, e.port, deadline);
  if (!fd.ok()) {
    lost_ = true;
    return fd.status();
  }
  *connected = true;
  const std::string what = Where(e);
  socket_plane::Link link(*std::move(fd));
  if (shm) {
    // The server's first words: its instance, checked before the token goes out.
    uint64_t instance = 0;
    SUMMA_RETURN_IF_ERROR(link.ReadFull(reinterpret_cast<char*>(&instance), sizeof(instance), deadline,
                                        absl::StrCat(what, ": its instance")));
    if (instance != e.shm_instance) {
      lost_ = true;  // ask the server where its plane is again
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": the socket belongs to another server than the one asked (its instance differs)"));
    }
  }
  if (tls_ != nullptr && !shm) {
    if (absl::Status s = link.StartTls(*tls_, e.host, deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
  }
  char hello[socket_plane::kHelloBytes];
  socket_plane::EncodeHello(static_cast<uint32_t>(authorization_.size()), hello);
  iovec iov[2] = {{hello, sizeof(hello)}, {const_cast<char*>(authorization_.data()), authorization_.size()}};
  SUMMA_RETURN_IF_ERROR(link.WriteFull(iov, authorization_.empty() ? 1 : 2, deadline, absl::StrCat(what, ": hello")));
  char head[kHeaderBytes];
  SUMMA_RETURN_IF_ERROR(link.ReadFull(head, sizeof(head), deadline, absl::StrCat(what, ": hello")));
  const socket_plane::ReplyHeader answer = socket_plane::DecodeReplyHeader(head);
  if (answer.code != 0) {
    const absl::Status refused = ReadRefusal(link, answer, deadline);
    return absl::Status(refused.code(), absl::StrCat(what, ": ", refused.message()));
  }
  auto c = std::make_unique<Connection>();
  c->link = std::move(link);
  c->shard = shard;
  if (shm) {
    if (absl::Status s = Attach(e, *c, deadline); !s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  connections_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::Status SocketCalls::Attach(const Endpoint& e, Connection& c, absl::Time deadline) {
  SUMMA_ASSIGN_OR_RETURN(c.requests, SharedSegment::Create("summa-requests", segment_bytes_, /*writable_by_others=*/true));
  char attach[socket_plane::kAttachBytes];
  const uint64_t request_bytes = c.requests.size(), reply_bytes = c.requests.size();
  std::memcpy(attach, &request_bytes, 8);
  std::memcpy(attach + 8, &reply_bytes, 8);
  SUMMA_RETURN_IF_ERROR(
      socket_plane::SendWithFd(c.link.fd(), attach, sizeof(attach), c.requests.fd(), deadline, "the attach"));
  c.requests.CloseDescriptor();  // sent once; the mapping stays
  char head[kHeaderBytes];
  socket_plane::OwnedFd segment;
  SUMMA_RETURN_IF_ERROR(socket_plane::ReceiveWithFd(c.link.fd(), head, sizeof(head), &segment, deadline, "the attach"));
  const socket_plane::ReplyHeader answer = socket_plane::DecodeReplyHeader(head);
  if (answer.code != 0) return ReadRefusal(c.link, answer, deadline);
  char body[socket_plane::kAttachBytes];
  if (answer.length != sizeof(body) || answer.message_length != 0) {
    return absl::DataLossError("a malformed answer to the attach");
  }
  socket_plane::OwnedFd more;
  SUMMA_RETURN_IF_ERROR(socket_plane::ReceiveWithFd(c.link.fd(), body, sizeof(body), &more, deadline, "the attach"));
  if (!segment.valid()) segment = std::move(more);
  uint64_t size, instance;
  std::memcpy(&size, body, 8);
  std::memcpy(&instance, body + 8, 8);
  if (instance != e.shm_instance) {
    lost_ = true;
    return absl::FailedPreconditionError("the attach's answer names another instance than the server's first words");
  }
  if (!segment.valid()) return absl::DataLossError("the attach's answer carried no reply segment");
  SUMMA_ASSIGN_OR_RETURN(c.replies, SharedSegment::Adopt(segment.release(), size, reply_bytes,
                                                         SharedSegment::Access::kReadOnly, "the reply segment"));
  return absl::OkStatus();
}

bool SocketCalls::AttachValues(Connection& c, absl::Time deadline) {
  const std::string what = absl::StrCat(Where(shards_[c.shard]), ": the values segment");
  auto refused = [&](absl::string_view why) {
    values_refused_[c.shard] = 1;
    SUMMA_LOG(WARNING) << what << " was refused (" << why << "): requests to this shard copy their values";
  };
  absl::StatusOr<int> read_only = values_->ReadOnlyDescriptor();
  if (!read_only.ok()) {  // nothing sent: the connection goes on, copying
    refused(read_only.status().message());
    return true;
  }
  const socket_plane::OwnedFd sent(*read_only);
  char head[kHeaderBytes];
  socket_plane::EncodeRequestHeader({socket_plane::kAttachValues, values_->size(), 0}, head);
  absl::Status s = socket_plane::SendWithFd(c.link.fd(), head, sizeof(head), sent.get(), deadline, what);
  if (s.ok()) s = c.link.ReadFull(head, sizeof(head), deadline, what);
  if (!s.ok()) return false;
  const socket_plane::ReplyHeader answer = socket_plane::DecodeReplyHeader(head);
  if (answer.message_length > socket_plane::kMaxStatusMessageBytes ||
      answer.length > socket_plane::kMaxStatusMessageBytes || (answer.code == 0 && answer.length != 0)) {
    return false;
  }
  std::string said(answer.message_length + answer.length, '\0');  // the message, and any details
  if (!c.link.ReadFull(said.data(), said.size(), deadline, what).ok()) return false;
  if (answer.code != 0) {
    // A server that does not know the frame refuses it as an unknown method and closes the
    // connection: a new one, without the segment, takes the call.
    refused(said.substr(0, answer.message_length));
    return false;
  }
  c.values = values_;
  return true;
}

absl::Status SocketCalls::AssemblePieces(Connection& c) {
  std::map<uint64_t, SharedSegment>& published = published_[c.shard];
  // Before any of this reply's pieces is mapped: none of them can be forgotten.
  if (published.size() >= kMaxPublished) ForgetPublished(c.shard);
  c.reply_slices.clear();
  c.reply_segments.clear();
  size_t next_fd = 0;
  uint64_t total = 0;
  const char* in = c.pieces.data();
  for (size_t k = 0; k < c.pieces.size() / socket_plane::kPieceBytes; ++k) {
    uint64_t v[4];
    std::memcpy(v, in + k * socket_plane::kPieceBytes, sizeof(v));
    const uint64_t segment = v[0], offset = v[1], length = v[2], size = v[3];
    const SharedSegment* from = &c.replies;
    if (segment != 0) {
      // Every published piece comes with its segment's descriptor: mapped the first time, once.
      if (next_fd >= c.passed.size()) return absl::DataLossError("a published piece came without its descriptor");
      socket_plane::OwnedFd fd = std::move(c.passed[next_fd++]);
      auto found = published.find(segment);
      if (found == published.end()) {
        SUMMA_ASSIGN_OR_RETURN(SharedSegment mapped, SharedSegment::Adopt(fd.release(), size, size,
                                                                          SharedSegment::Access::kReadOnly,
                                                                          "a published segment"));
        found = published.emplace(segment, std::move(mapped)).first;
      }
      from = &found->second;
      c.reply_segments.push_back(segment);
    }
    if (offset > from->size() || length > from->size() - offset) {
      return absl::DataLossError(absl::StrCat("a piece at [", offset, ", +", length, ") of a segment of ", from->size()));
    }
    c.reply_slices.emplace_back(from->data() + offset, length, grpc::Slice::STATIC_SLICE);
    total += length;
  }
  if (total != c.reply.length) {
    return absl::DataLossError(absl::StrCat("pieces of ", total, " bytes for a reply of ", c.reply.length));
  }
  *calls_[c.tag].reply = grpc::ByteBuffer(c.reply_slices.data(), c.reply_slices.size());
  return absl::OkStatus();
}

void SocketCalls::ForgetPublished(int shard) {
  // The mappings no reply still held names go: the server made new segments since (a pool grew,
  // a collective was forgotten), and the old ones would keep their memory alive here.
  absl::flat_hash_set<uint64_t> held;
  for (const auto& c : connections_) {
    if (c->shard != shard || c->reply_owner == Connection::kNoTag) continue;
    held.insert(c->reply_segments.begin(), c->reply_segments.end());
  }
  std::map<uint64_t, SharedSegment>& published = published_[shard];
  for (auto it = published.begin(); it != published.end();) {
    it = held.contains(it->first) ? std::next(it) : published.erase(it);
  }
}

void SocketCalls::MoveReplyAside(Connection& c) {
  const size_t owner = c.reply_owner;
  c.reply_owner = Connection::kNoTag;
  if (owner == Connection::kNoTag) return;
  reply_home_[owner] = nullptr;
  grpc::ByteBuffer* reply = calls_[owner].reply;
  if (!reply->Valid()) return;  // the caller is done with it
  const size_t length = reply->Length();
  char* aside = bodies_[owner].Resize(length);
  std::vector<grpc::Slice> slices;
  (void)reply->Dump(&slices);
  for (const grpc::Slice& s : slices) {
    if (s.size() > 0) std::memcpy(aside, s.begin(), s.size());
    aside += s.size();
  }
  grpc::Slice slice(bodies_[owner].view().data(), length, grpc::Slice::STATIC_SLICE);
  *reply = grpc::ByteBuffer(&slice, 1);
}

absl::Status SocketCalls::Acquire(int shard, absl::Time deadline, Connection** found) {
  *found = nullptr;
  int open = 0;
  Connection* holding = nullptr;  // free, but holding a reply
  for (auto& c : connections_) {
    if (c->shard != shard || !c->link.valid()) continue;
    ++open;
    if (c->busy) continue;
    if (c->reply_owner == Connection::kNoTag) {
      *found = c.get();
      return absl::OkStatus();
    }
    holding = c.get();
  }
  if (open >= caps_[shard]) {
    if (holding != nullptr) {
      MoveReplyAside(*holding);
      *found = holding;
    }
    return absl::OkStatus();
  }
  const bool was_lost = lost_;
  if (absl::Status opened = Open(shard, deadline); !opened.ok()) {
    if (open == 0) return opened;
    // The server takes no more connections now (at its limit, say): the call waits for one of
    // this shard's own to come free, and no more are asked for until one of them closes.
    lost_ = was_lost;
    caps_[shard] = open;
    return absl::OkStatus();
  }
  *found = connections_.back().get();
  return absl::OkStatus();
}

void SocketCalls::Start(size_t tag, int shard, socket_plane::DataMethod method, const grpc::ByteBuffer* request,
                        grpc::ByteBuffer* reply, absl::Time deadline) {
  if (tag >= calls_.size()) {
    calls_.resize(tag + 1);
    bodies_.resize(tag + 1);
    reply_home_.resize(tag + 1, nullptr);
  }
  // This tag's last reply is no longer wanted: its connection may take any call, and the server
  // may reuse the published buffers it named (told now: a connection left idle would hold them).
  if (Connection* home = reply_home_[tag]; home != nullptr) {
    home->reply_owner = Connection::kNoTag;
    reply_home_[tag] = nullptr;
    if (!home->reply_segments.empty() && home->link.valid()) {
      home->reply_segments.clear();
      char release[kHeaderBytes];
      socket_plane::EncodeRequestHeader({socket_plane::kReleaseReply, 0, 0}, release);
      // 16 bytes on an idle connection: they fit its socket's buffer; if not, the next call's
      // request releases the reply instead.
      [[maybe_unused]] const ssize_t sent =
          ::send(home->link.fd(), release, sizeof(release), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
  calls_[tag] = Call{shard, method, request, reply, deadline};
  ++in_flight_;
  Connection* c = nullptr;
  if (absl::Status s = Acquire(shard, deadline, &c); !s.ok()) {
    ended_.emplace_back(tag, std::move(s));
    return;
  }
  if (c == nullptr) {
    waiting_.push_back(tag);
    return;
  }
  Begin(*c, tag);
}

bool SocketCalls::PlaceOfValues(const std::vector<iovec>& iov, uint64_t place[2]) const {
  if (iov.size() < 3) return false;  // the header, the fields, the values
  const char* from = static_cast<const char*>(iov.back().iov_base);
  const uint64_t length = iov.back().iov_len;
  if (from < values_->data() || length > values_->size() ||
      static_cast<uint64_t>(from - values_->data()) > values_->size() - length ||
      (from - values_->data()) % alignof(float) != 0) {
    return false;
  }
  place[0] = static_cast<uint64_t>(from - values_->data());
  place[1] = length;
  return true;
}

void SocketCalls::Begin(Connection& c, size_t tag) {
  const Call& call = calls_[tag];
  c.busy = true;
  c.tag = tag;
  c.passed.clear();
  c.stage = Connection::Stage::kSend;
  c.request_cut = false;
  socket_plane::Gather(*call.request, c.request_head, sizeof(c.request_head), c.slices, c.iov);
  // A message with values is its fields, then the values as a slice of their own (common/wire):
  // padding ahead of it puts the values on a 4-byte boundary, where the server reads them in place.
  static constexpr char kZeros[socket_plane::kMaxLead] = {};
  const uint64_t length = call.request->Length();
  const uint32_t lead = c.slices.size() >= 2 ? socket_plane::LeadFor(length - c.slices.back().size()) : 0;
  if (c.requests.valid() && values_ != nullptr && c.values != values_ && !values_refused_[c.shard] &&
      !AttachValues(c, call.deadline)) {
    // The connection goes; the call waits for another (a new one, or an error if none opens).
    c.link.Reset();
    c.busy = false;
    c.slices.clear();
    waiting_.push_front(tag);
    return;
  }
  if (c.requests.valid()) {
    // The shared-memory plane: the request into this connection's segment (the server is done
    // with the last one: it answered it), only the header on the socket. Values that lie in the
    // values segment are named there (their place first, then the message before them), not copied.
    uint64_t place[2];
    const bool elsewhere = c.values != nullptr && c.values == values_ && PlaceOfValues(c.iov, place);
    const size_t copied = elsewhere ? c.iov.size() - 1 : c.iov.size();  // iov[1, copied) go in
    const uint32_t at = elsewhere ? 0 : lead;
    uint64_t bytes = elsewhere ? sizeof(place) : 0;
    for (size_t k = 1; k < copied; ++k) bytes += c.iov[k].iov_len;
    if (at + bytes <= c.requests.size()) {
      char* to = c.requests.data() + at;
      if (elsewhere) {
        std::memcpy(to, place, sizeof(place));
        to += sizeof(place);
      }
      for (size_t k = 1; k < copied; ++k) {
        std::memcpy(to, c.iov[k].iov_base, c.iov[k].iov_len);
        to += c.iov[k].iov_len;
      }
      c.iov.resize(1);
      c.slices.clear();
      const uint32_t flags = socket_plane::kInSegment | (elsewhere ? socket_plane::kValuesElsewhere : 0);
      socket_plane::EncodeRequestHeader({static_cast<uint32_t>(call.method) | flags, bytes, at}, c.request_head);
      c.iov_at = 0;
      Advance(c);
      return;
    }
  }
  socket_plane::EncodeRequestHeader({static_cast<uint32_t>(call.method), length, lead}, c.request_head);
  if (lead > 0) c.iov.insert(c.iov.begin() + 1, {const_cast<char*>(kZeros), lead});
  c.iov_at = 0;
  if (sending_[c.shard] >= kSendsPerShard) {
    c.stage = Connection::Stage::kQueued;  // Next sends it when the one ahead has gone out
    send_queue_[c.shard].push_back(&c);
    return;
  }
  ++sending_[c.shard];
  c.counted = true;
  Advance(c);  // most requests go out at once
}

void SocketCalls::LeaveSend(Connection& c) {
  if (c.counted) --sending_[c.shard];
  c.counted = false;
  if (c.stage == Connection::Stage::kQueued) {
    std::deque<Connection*>& queue = send_queue_[c.shard];
    queue.erase(std::find(queue.begin(), queue.end(), &c));
  }
  c.slices.clear();
  c.stage = Connection::Stage::kHead;
  c.got = 0;
}

void SocketCalls::SendQueued() {
  for (size_t shard = 0; shard < send_queue_.size(); ++shard) {
    std::deque<Connection*>& queue = send_queue_[shard];
    while (!queue.empty() && sending_[shard] < kSendsPerShard) {
      Connection& c = *queue.front();
      queue.pop_front();
      c.stage = Connection::Stage::kSend;
      ++sending_[shard];
      c.counted = true;
      Advance(c);
    }
  }
}

void SocketCalls::Advance(Connection& c) {
  const Endpoint& e = shards_[c.shard];
  const std::string where = Where(e);
  auto failed = [&](absl::string_view what) { End(c, absl::UnavailableError(absl::StrCat(where, ": ", what))); };
  // Receives into `to` up to `want` bytes; false when nothing more can be read now (or the call ended).
  auto receive = [&](char* to, uint64_t want) -> bool {
    absl::StatusOr<size_t> n = c.requests.valid() ? socket_plane::ReceiveSome(c.link.fd(), to, want, &c.passed)
                                                  : c.link.Receive(to, want, &c.wait);
    if (c.requests.valid()) c.wait = POLLIN;
    if (!n.ok()) {
      failed(absl::IsUnavailable(n.status()) && absl::StrContains(n.status().message(), "closed")
                 ? "the server closed the connection"
                 : n.status().message());
      return false;
    }
    c.got += *n;
    return *n > 0;
  };
  for (;;) {
    switch (c.stage) {
      case Connection::Stage::kSend: {
        absl::StatusOr<size_t> sent =
            c.link.Send(c.iov.data() + c.iov_at, static_cast<int>(c.iov.size() - c.iov_at), &c.wait);
        if (!sent.ok()) return failed(sent.status().message());
        if (*sent == 0) return;
        size_t n = *sent;
        while (c.iov_at < c.iov.size() && n >= c.iov[c.iov_at].iov_len) {
          n -= c.iov[c.iov_at].iov_len;
          ++c.iov_at;
        }
        if (c.iov_at < c.iov.size()) {
          iovec& v = c.iov[c.iov_at];
          v.iov_base = static_cast<char*>(v.iov_base) + n;
          v.iov_len -= n;
          continue;
        }
        if (c.counted) {
          c.stage = Connection::Stage::kDrain;
          continue;
        }
        LeaveSend(c);
        break;
      }
      case Connection::Stage::kDrain: {
        int unacked = 0;
        if (::ioctl(c.link.fd(), SIOCOUTQ, &unacked) != 0) unacked = 0;
        if (unacked > kMaxUnackedBytes) {
          pollfd reply = {c.link.fd(), POLLIN, 0};
          if (::poll(&reply, 1, 0) <= 0) return;  // Next looks again within a millisecond
        }
        LeaveSend(c);
        break;
      }
      case Connection::Stage::kQueued:
        return;
      case Connection::Stage::kHead: {
        if (!receive(c.reply_head + c.got, kHeaderBytes - c.got)) return;
        if (c.got < kHeaderBytes) continue;
        c.reply = socket_plane::DecodeReplyHeader(c.reply_head);
        c.reply_in_segment = c.replies.valid() && (c.reply.code & socket_plane::kInSegment) != 0;
        c.reply_pieces = c.reply_in_segment && (c.reply.code & socket_plane::kPieces) != 0;
        if (c.reply_in_segment) {
          c.reply.code &= ~(socket_plane::kInSegment | socket_plane::kPieces);
          if (!c.reply_pieces && c.reply.length > c.replies.size()) {
            return End(c, absl::DataLossError(absl::StrCat(where, " sent a reply of ",
                                                           c.reply.length, " bytes for a segment of ", c.replies.size())));
          }
        }
        if (c.reply.message_length > socket_plane::kMaxStatusMessageBytes || c.reply.length > kMaxReplyBytes ||
            (c.reply.code != 0 && c.reply.length > socket_plane::kMaxStatusMessageBytes)) {
          return End(c, absl::DataLossError(absl::StrCat(where, " sent a malformed reply header")));
        }
        c.message.resize(c.reply.message_length);
        c.body = c.reply_in_segment ? c.replies.data() : bodies_[c.tag].Resize(c.reply.length);
        c.stage = Connection::Stage::kMessage;
        c.got = 0;
        break;
      }
      case Connection::Stage::kMessage:
        if (c.got < c.message.size()) {
          if (!receive(c.message.data() + c.got, c.message.size() - c.got)) return;
          continue;
        }
        c.stage = c.reply_pieces ? Connection::Stage::kPieceCount : Connection::Stage::kBody;
        c.got = 0;
        break;
      case Connection::Stage::kPieceCount: {
        if (!receive(c.piece_count + c.got, sizeof(c.piece_count) - c.got)) return;
        if (c.got < sizeof(c.piece_count)) continue;
        uint32_t count, reserved;
        std::memcpy(&count, c.piece_count, 4);
        std::memcpy(&reserved, c.piece_count + 4, 4);
        if (count == 0 || count > socket_plane::kMaxPieces || reserved != 0 || c.reply.code != 0) {
          return End(c, absl::DataLossError(absl::StrCat(where, " sent a malformed list of pieces (", count, ")")));
        }
        c.pieces.resize(count * socket_plane::kPieceBytes);
        c.stage = Connection::Stage::kPieces;
        c.got = 0;
        break;
      }
      case Connection::Stage::kPieces: {
        if (c.got < c.pieces.size()) {
          if (!receive(c.pieces.data() + c.got, c.pieces.size() - c.got)) return;
          continue;
        }
        absl::Status assembled = AssemblePieces(c);
        c.passed.clear();
        if (!assembled.ok()) {
          return End(c, absl::DataLossError(absl::StrCat(where, ": ", assembled.message())));
        }
        c.reply_owner = c.tag;
        reply_home_[c.tag] = &c;
        return End(c, absl::OkStatus());
      }
      case Connection::Stage::kBody:
        if (c.reply_in_segment) c.got = c.reply.length;  // there already
        if (c.got < c.reply.length) {
          if (!receive(c.body + c.got, c.reply.length - c.got)) return;
          continue;
        }
        if (c.reply.code != 0) {  // a refusal's body is its details (common/rpc/grpc_status.h)
          return End(c, StatusFromDetails(static_cast<absl::StatusCode>(c.reply.code), c.message,
                                          absl::string_view(c.body, c.reply.length)));
        }
        grpc::Slice slice(c.body, c.reply.length, grpc::Slice::STATIC_SLICE);
        *calls_[c.tag].reply = grpc::ByteBuffer(&slice, 1);
        if (c.reply_in_segment) {
          // Read in place: the connection keeps it until the tag starts again (or moves it aside).
          c.reply_owner = c.tag;
          reply_home_[c.tag] = &c;
        }
        return End(c, absl::OkStatus());
    }
  }
}

void SocketCalls::End(Connection& c, absl::Status status) {
  ended_.emplace_back(c.tag, status);
  if (c.stage == Connection::Stage::kSend || c.stage == Connection::Stage::kDrain ||
      c.stage == Connection::Stage::kQueued) {
    LeaveSend(c);
  }
  c.busy = false;
  c.slices.clear();
  // A failed call leaves its connection mid-frame (or the server closed it), and so does one
  // answered before its request was all sent (whose unsent bytes a TLS link still holds): it goes.
  if (!status.ok() || c.request_cut) c.link.Reset();
}

bool SocketCalls::Next(size_t* tag, absl::Status* status) {
  std::vector<pollfd>& fds = pollfds_;
  std::vector<Connection*>& polled = polled_;
  for (;;) {
    if (!ended_.empty()) {
      *tag = ended_.front().first;
      *status = std::move(ended_.front().second);
      ended_.pop_front();
      --in_flight_;
      return true;
    }
    if (in_flight_ == 0) return false;
    // Closed connections go; waiting calls take the connections free (or openable) now.
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [&](const std::unique_ptr<Connection>& c) {
                                        if (c->link.valid()) return false;
                                        caps_[c->shard] = kMaxConnectionsPerShard;  // room again
                                        MoveReplyAside(*c);  // its segments go with it
                                        return true;
                                      }),
                       connections_.end());
    for (size_t k = waiting_.size(); k > 0; --k) {
      const size_t t = waiting_.front();
      waiting_.pop_front();
      Connection* c = nullptr;
      if (absl::Status s = Acquire(calls_[t].shard, calls_[t].deadline, &c); !s.ok()) {
        ended_.emplace_back(t, std::move(s));
      } else if (c == nullptr) {
        waiting_.push_back(t);
      } else {
        Begin(*c, t);
      }
    }
    if (!ended_.empty()) continue;
    absl::Time deadline = absl::InfiniteFuture();
    fds.clear();
    polled.clear();
    SendQueued();
    if (!ended_.empty()) continue;
    bool draining = false;
    for (auto& c : connections_) {
      if (!c->busy) continue;
      deadline = std::min(deadline, calls_[c->tag].deadline);
      if (c->stage == Connection::Stage::kQueued) continue;  // nothing to read or write yet
      draining = draining || (c->stage == Connection::Stage::kDrain && !send_queue_[c->shard].empty());
      const short events = c->stage == Connection::Stage::kSend ? POLLOUT | POLLIN : POLLIN;
      fds.push_back({c->link.fd(), static_cast<short>(events | c->wait), 0});
      polled.push_back(c.get());
    }
    for (size_t t : waiting_) deadline = std::min(deadline, calls_[t].deadline);
    fds.push_back({wake_.get(), POLLIN, 0});  // last, with no connection in polled
    int timeout = -1;
    if (deadline != absl::InfiniteFuture()) {
      timeout = static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0, 1 << 30));
    }
    // No event says that the peer acknowledged bytes: a draining request is looked at each
    // millisecond (while its shard's next request waits, the link carries the rest of it).
    if (draining && (timeout < 0 || timeout > 1)) timeout = 1;
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    bool woken = false;
    if (ready > 0 && fds.back().revents != 0) {
      uint64_t count;
      woken = ::read(wake_.get(), &count, sizeof(count)) == sizeof(count);
    }
    if (ready > 0 || draining) {
      for (size_t k = 0; k < polled.size(); ++k) {
        Connection& c = *polled[k];
        if (!c.busy || (fds[k].revents == 0 && c.stage != Connection::Stage::kDrain)) continue;
        if (c.stage == Connection::Stage::kSend && (fds[k].revents & POLLIN) && c.wait != POLLIN) {
          // A reply before the whole request went out is a refusal (a request over the
          // server's limit): read it rather than push the rest at a server that reads no more.
          // (Not when the write itself waits to read: TLS may have to, to go on sending.)
          LeaveSend(c);
          c.request_cut = true;
        }
        Advance(c);
      }
    }
    const absl::Time now = absl::Now();
    for (auto& c : connections_) {
      if (c->busy && calls_[c->tag].deadline <= now) {
        End(*c, absl::DeadlineExceededError("the call's deadline passed on the data plane"));
      }
    }
    for (size_t k = waiting_.size(); k > 0; --k) {
      const size_t t = waiting_.front();
      waiting_.pop_front();
      if (calls_[t].deadline <= now) {
        ended_.emplace_back(t, absl::DeadlineExceededError("the call's deadline passed waiting for a connection"));
      } else {
        waiting_.push_back(t);
      }
    }
    if (woken && ended_.empty()) {
      *tag = kWoken;
      *status = absl::OkStatus();
      return true;
    }
  }
}

}  // namespace summa::worker
