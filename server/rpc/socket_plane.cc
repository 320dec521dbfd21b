#include "server/rpc/socket_plane.h"

#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <utility>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/rpc/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/rpc/wire.h"
#include "common/shared_segment.h"
#include "server/core/snapshot.h"
#include "server/rpc/shm_segments.h"
#include "server/rpc/hello_evictions.h"

namespace summa::server {
namespace {

using socket_plane::DataMethod;
using socket_plane::OwnedFd;

// How long a reply may take to write.
constexpr absl::Duration kFrameTimeout = absl::Minutes(5);

// How long a request's body may take once its header arrived: 10 s, and a second for every 4 MiB
// (a client that stalls mid-request holds one of the plane's few buffers that long, no longer).
absl::Duration BodyTimeout(uint64_t bytes) {
  return absl::Seconds(10) + absl::Seconds(static_cast<int64_t>(bytes >> 22));
}
// Events a flood makes many of (evictions, failed hellos) are logged at most this often.
constexpr absl::Duration kTallyLineEvery = absl::Seconds(10);
// The most a request buffer of the plane's keeps between calls.
constexpr size_t kKeepBytes = 16 << 20;

// gRPC's spelling of a peer ("ipv4:127.0.0.1:5555", "ipv6:[::1]:5555"), which the budgets key on.
std::string PeerOf(int fd) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  char host[NI_MAXHOST] = "";
  char port[NI_MAXSERV] = "";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 && address.ss_family == AF_UNIX) {
    // The shared-memory plane's: one source per user on this host.
    return absl::StrCat("unix:uid=", socket_plane::PeerUid(fd));
  }
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&address), length, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown";
  }
  absl::string_view name = host;
  // An IPv4 client of a listener on every address comes as ::ffff:a.b.c.d: gRPC's "ipv4:" it
  // is, so that one host is one peer to the limits on both transports.
  if (address.ss_family == AF_INET6 && !absl::ConsumePrefix(&name, "::ffff:")) {
    return absl::StrCat("ipv6:[", name, "]:", port);
  }
  return absl::StrCat("ipv4:", name, ":", port);
}

// Writes a reply frame to `link` within `deadline`: `status`, and `response` when it is OK, or the
// status's details (its reason) as the body when it is not and the client said it reads them
// (`details`: its hello's kHelloRefusalDetails). `slices` and `iov` are the caller's, kept across
// replies.
absl::Status WriteReply(socket_plane::Link& link, const grpc::Status& status, const grpc::ByteBuffer& response, absl::Time deadline,
                        std::vector<grpc::Slice>& slices, std::vector<iovec>& iov, bool details_ok = false) {
  const std::string& message = status.error_message();
  const uint32_t message_length =
      static_cast<uint32_t>(std::min<size_t>(message.size(), socket_plane::kMaxStatusMessageBytes));
  socket_plane::ReplyHeader header;
  header.code = static_cast<uint32_t>(status.error_code());
  header.message_length = message_length;
  const std::string& details = status.error_details();
  const bool with_details =
      details_ok && !status.ok() && !details.empty() && details.size() <= socket_plane::kMaxStatusMessageBytes;
  header.length = status.ok() && response.Valid() ? response.Length() : with_details ? details.size() : 0;
  char head[socket_plane::kHeaderBytes];
  socket_plane::EncodeReplyHeader(header, head);
  socket_plane::Gather(status.ok() && header.length > 0 ? response : grpc::ByteBuffer(), head, sizeof(head), slices,
                       iov);
  if (message_length > 0) iov.insert(iov.begin() + 1, {const_cast<char*>(message.data()), message_length});
  if (with_details) iov.push_back({const_cast<char*>(details.data()), details.size()});
  return link.WriteFull(iov.data(), static_cast<int>(iov.size()), deadline, "a reply");
}

// One call read from a connection, as the service's handlers see it. It lives on the
// connection's thread, which waits for Answer before it goes.
class SocketCall final : public DataCall {
 public:
  SocketCall(const std::string& peer, const std::string& authorization, absl::Span<char> whole,
             const grpc::ByteBuffer& request, grpc::ByteBuffer* response, int wake, bool shared,
             std::optional<absl::string_view> values_elsewhere)
      : peer_(peer), authorization_(authorization), whole_(whole), request_(request), response_(response),
        wake_(wake), shared_(shared), values_elsewhere_(values_elsewhere) {}

  std::string peer() const override { return peer_; }
  absl::StatusOr<Caller> Identify(const TokenCheck& tokens, Role role) const override {
    return tokens.Identify(authorization_, role);
  }
  const grpc::ByteBuffer& request() const override { return request_; }
  std::optional<absl::Span<char>> whole_request() override { return whole_; }
  bool request_shared() const override { return shared_; }
  std::optional<absl::string_view> values_elsewhere() const override { return values_elsewhere_; }
  grpc::ByteBuffer* response() override { return response_; }
  void Answer(const grpc::Status& status) override {
    int wake;
    {
      absl::MutexLock lock(&mu_);
      status_ = status;
      // Read before the lock goes: once it has, the connection's thread may end the call (the
      // eventfd's write below is what it waits for, but TSan with io_sync=0 sees only the lock).
      wake = wake_;
    }
    const uint64_t one = 1;
    while (::write(wake, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const std::string& peer_;
  const std::string& authorization_;
  const absl::Span<char> whole_;
  const grpc::ByteBuffer& request_;
  grpc::ByteBuffer* const response_;
  const int wake_;
  const bool shared_;  // `whole_` is in the client's segment
  const std::optional<absl::string_view> values_elsewhere_;
  absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// A count of events that anyone who reaches the port can make many of, each worth a line: the
// first is logged, then at most one line every kTallyLineEvery, with the count since the last.
// Thread-safe.
class SocketPlane::Tally {
 public:
  // Counts one; true when a line is due, with the events since the last line (this one too) in
  // `since`.
  bool Note(uint64_t* since) {
    absl::MutexLock lock(&mu_);
    ++total_;
    ++unlogged_;
    const absl::Time now = absl::Now();
    if (now < next_line_) return false;
    *since = std::exchange(unlogged_, 0);
    next_line_ = now + kTallyLineEvery;
    return true;
  }
  uint64_t total() const {
    absl::MutexLock lock(&mu_);
    return total_;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_line_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The buffers requests are read into, a few for the whole plane, each keeping its capacity (up
// to kKeepBytes) across calls: no allocation per call, and memory that does not grow with the
// connections.
class SocketPlane::BodyBuffers {
 public:
  explicit BodyBuffers(int count) : all_(count) {
    for (Scratch& s : all_) free_.push_back(&s);
  }

  // A buffer, held until the lease goes (waits while all are held: each is held only while a
  // request is read and handled, which never waits on another call).
  class Lease {
   public:
    Lease() = default;
    Lease(BodyBuffers* owner, Scratch* buffer) : owner_(owner), buffer_(buffer) {}
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept {
      if (this != &other) {
        Return();
        owner_ = std::exchange(other.owner_, nullptr);
        buffer_ = std::exchange(other.buffer_, nullptr);
      }
      return *this;
    }
    ~Lease() { Return(); }
    Scratch* operator->() const { return buffer_; }

   private:
    void Return() {
      if (owner_ != nullptr) owner_->Give(buffer_);
      owner_ = nullptr;
      buffer_ = nullptr;
    }
    BodyBuffers* owner_ = nullptr;
    Scratch* buffer_ = nullptr;
  };

  Lease Take() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<Scratch*>* free) { return !free->empty(); }, &free_));
    Scratch* buffer = free_.back();
    free_.pop_back();
    return Lease(this, buffer);
  }

 private:
  void Give(Scratch* buffer) {
    // A buffer that an unusually large request grew goes back (gRPC's path keeps 16 MiB too).
    if (buffer->capacity() > kKeepBytes) buffer->Release();
    absl::MutexLock lock(&mu_);
    free_.push_back(buffer);
  }

  std::vector<Scratch> all_;
  absl::Mutex mu_;
  std::vector<Scratch*> free_ ABSL_GUARDED_BY(mu_);
};

class SocketPlane::Connection {
 public:
  Connection(SocketPlane* plane, OwnedFd fd)
      : plane_(plane),
        peer_(PeerOf(fd.get())),
        source_(PeerKey(-1, peer_)),
        hello_deadline_(absl::Now() + plane->options_.hello_timeout),
        link_(std::move(fd)),
        wake_(::eventfd(0, EFD_CLOEXEC)) {}
  ~Connection() {
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    thread_ = std::thread([this] {
      Run();
      {
        absl::MutexLock lock(&fd_mu_);
        link_.Reset();
      }
      done_.store(true, std::memory_order_release);
    });
  }
  // Ends the connection (`how`: SHUT_RD, or SHUT_RDWR): its thread's read or wait returns (and,
  // with SHUT_RDWR, its write).
  void Close(int how) {
    absl::MutexLock lock(&fd_mu_);
    if (link_.valid()) ::shutdown(link_.fd(), how);
  }
  bool done() const { return done_.load(std::memory_order_acquire); }

  // The acceptor's view of the hello phase (under the plane's mu_).
  const std::string& source() const { return source_; }
  bool in_hello() const { return !done() && phase_.load(std::memory_order_acquire) == Phase::kHello; }
  // Whether the client has sent no byte yet: the kernel's count, whoever read them (the hello's
  // reads, or a TLS handshake's). False where the kernel does not say.
  bool Silent() {
    absl::MutexLock lock(&fd_mu_);
    tcp_info info = {};
    socklen_t length = sizeof(info);
    if (!link_.valid() || ::getsockopt(link_.fd(), IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
        length < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
      return false;
    }
    return info.tcpi_bytes_received == 0;
  }
  // Closes the connection if it is still in its hello (its thread ends at once); false when its
  // hello passed first, which the connection then keeps.
  bool Evict() {
    Phase hello = Phase::kHello;
    if (!phase_.compare_exchange_strong(hello, Phase::kEvicted, std::memory_order_acq_rel)) return false;
    Close(SHUT_RDWR);
    return true;
  }

 private:
  void Run() {
    const absl::Status hello =
        wake_.valid() ? Hello() : absl::ResourceExhaustedError("no eventfd for the connection");
    if (!hello.ok()) return HelloFailed(hello);
    plane_->hellos_passed_.fetch_add(1, std::memory_order_relaxed);
    if (plane_->shm()) {
      absl::Status refusal;
      absl::Status attached = shm_.Attach(link_.fd(), plane_->options_.max_message_bytes, plane_->options_.shm_instance,
                                          absl::Now() + plane_->options_.hello_timeout, &refusal);
      if (attached.ok() && !refusal.ok()) attached = Refuse(refusal);
      if (!attached.ok()) {
        if (!absl::IsUnavailable(attached)) {
          SUMMA_LOG(WARNING) << "shared-memory plane: " << peer_ << ": " << attached.message();
          Linger();
        }
        return;
      }
    }
    absl::Status ended = hello;
    while (ended.ok()) ended = ServeOne();
    // A client closing its connection is the usual end; anything else is worth a line, and the
    // client is left time to read why before the connection closes.
    if (!absl::IsUnavailable(ended)) {
      SUMMA_LOG(WARNING) << "data plane: " << peer_ << ": " << ended.message();
      Linger();
    }
  }

  // Closes the sending side and reads (and drops) what the client still sends, until it closes
  // or a second passes: a close with bytes unread would reset the connection, and the client
  // could lose the refusal sent just before.
  void Linger() {
    ::shutdown(link_.fd(), SHUT_WR);
    char sink[64 << 10];
    const absl::Time give_up = absl::Now() + absl::Seconds(1);
    for (absl::Time now = absl::Now(); now < give_up; now = absl::Now()) {
      pollfd p = {link_.fd(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(give_up - now)) + 1) <= 0) continue;
      const ssize_t n = ::recv(link_.fd(), sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    }
  }

  // A hello that failed. Anyone who reaches the port can fail one as often as they like: counted,
  // and logged now and then. An eviction is the acceptor's to count, and a client that closed
  // (a probe of the port, say) is not worth a line. A refusal sent is left time to be read.
  void HelloFailed(const absl::Status& why) {
    if (phase_.load(std::memory_order_acquire) == Phase::kEvicted || absl::IsUnavailable(why)) return;
    uint64_t since = 0;
    if (plane_->hellos_failed_->Note(&since)) {
      SUMMA_LOG(WARNING) << "data plane: " << peer_ << ": " << why.message()
                         << (since > 1 ? absl::StrCat(" (", since, " failed hellos since the last such line)") : "");
    }
    // A TLS refusal's alert is a reply too (OpenSSL sent it): closing with the client's hello
    // unread would reset the connection and could lose it.
    if (replied_ || absl::IsUnauthenticated(why)) Linger();
  }

  // Leaves the hello phase, where the acceptor may evict the connection; false when it was
  // evicted first.
  bool LeaveHello() {
    Phase hello = Phase::kHello;
    return phase_.compare_exchange_strong(hello, Phase::kPassed, std::memory_order_acq_rel);
  }

  // Tells the client `why` (a reply with no message) and returns it: the connection's end.
  absl::Status Refuse(const absl::Status& why) {
    Reply(ToGrpcStatus(why), grpc::ByteBuffer()).IgnoreError();
    return why;
  }

  absl::Status Hello() {
    char fixed[socket_plane::kHelloBytes];
    const absl::Time deadline = hello_deadline_;
    if (plane_->tls_ != nullptr) SUMMA_RETURN_IF_ERROR(StartTls(deadline));
    if (plane_->shm()) {
      // The shared-memory plane speaks first: its instance, which a client checks before it
      // sends its token (a socket at that path may be anyone's on the client's host).
      char instance[socket_plane::kInstanceBytes];
      std::memcpy(instance, &plane_->options_.shm_instance, sizeof(instance));
      iovec iov = {instance, sizeof(instance)};
      SUMMA_RETURN_IF_ERROR(link_.WriteFull(&iov, 1, deadline, "the instance"));
    }
    SUMMA_RETURN_IF_ERROR(link_.ReadFull(fixed, sizeof(fixed), deadline, "the hello"));
    absl::StatusOr<uint32_t> length = socket_plane::DecodeHello(fixed);
    if (!length.ok()) return Refuse(length.status());
    details_ok_ = (socket_plane::HelloFlags(fixed) & socket_plane::kHelloRefusalDetails) != 0;
    authorization_.resize(*length);
    SUMMA_RETURN_IF_ERROR(
        link_.ReadFull(authorization_.data(), authorization_.size(), deadline, "the hello's token"));
    const absl::Status admitted = plane_->tokens_->Check(authorization_, Role::kWorker);
    // Before the answer: a client told its hello is done may open another connection at once,
    // and this one must no longer count against the hello-phase bounds then. A refused one stays
    // in the phase (evictable) until it closes.
    if (admitted.ok() && !LeaveHello()) return absl::UnavailableError("evicted in its hello");
    SUMMA_RETURN_IF_ERROR(Reply(ToGrpcStatus(admitted), grpc::ByteBuffer()));  // OK too: the hello's answer
    return admitted;
  }

  // The TLS handshake, within the hello's time. A client that opens with anything but TLS (a
  // plaintext hello, say) is told in plaintext why it is refused.
  absl::Status StartTls(absl::Time deadline) {
    unsigned char first = 0;
    for (;;) {
      const ssize_t n = ::recv(link_.fd(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 1) break;
      if (n == 0) return absl::UnavailableError("the connection closed before its TLS handshake");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return absl::UnavailableError(std::strerror(errno));
      SUMMA_RETURN_IF_ERROR(socket_plane::Await(link_.fd(), POLLIN, deadline, "the TLS handshake"));
    }
    if (first != socket_plane::kTlsHandshakeRecord) {
      return Refuse(absl::FailedPreconditionError(
          "this data plane speaks TLS 1.3 (summa-server --tls_cert): connect with TLS (--tls_ca), as to its gRPC port"));
    }
    // A handshake TLS refused (a certificate that does not verify, no TLS 1.3) comes back
    // UNAUTHENTICATED, a failed hello that HelloFailed counts and logs; a peer that closed,
    // UNAVAILABLE, which it does not.
    SUMMA_RETURN_IF_ERROR(link_.StartTls(*plane_->tls_, "", deadline));
    plane_->NoteTls(link_);
    return absl::OkStatus();
  }

  absl::Status ServeOne() {
    char head[socket_plane::kHeaderBytes];
    // Between calls a connection may stay idle for as long as its client likes.
    socket_plane::OwnedFd passed;  // a values segment, beside its frame (closed if anything else)
    SUMMA_RETURN_IF_ERROR(shm_.attached() ? socket_plane::ReceiveWithFd(link_.fd(), head, sizeof(head), &passed,
                                                                        absl::InfiniteFuture(), "a request's header")
                                          : link_.ReadFull(head, sizeof(head), absl::InfiniteFuture(), "a request's header"));
    // The client is done with the last reply: what it named of the published segments may change.
    shm_.ReleaseReply();
    socket_plane::RequestHeader header = socket_plane::DecodeRequestHeader(head);
    if (shm_.attached() && header.method == socket_plane::kReleaseReply) return absl::OkStatus();
    if (shm_.attached() && header.method == socket_plane::kAttachValues) {
      // Refused, the connection stays: its requests carry their values themselves.
      const absl::Status taken =
          shm_.AttachValues(passed.release(), header.length, plane_->options_.max_values_segment_bytes);
      return Reply(ToGrpcStatus(taken), grpc::ByteBuffer());
    }
    // Only a connection with a request segment reads the flags; on any other they make an unknown method.
    const bool in_segment = shm_.attached() && (header.method & socket_plane::kInSegment) != 0;
    const bool values_elsewhere = in_segment && (header.method & socket_plane::kValuesElsewhere) != 0;
    if (in_segment) header.method &= ~(socket_plane::kInSegment | socket_plane::kValuesElsewhere);
    const std::optional<DataMethod> method = DataMethodOfNumber(header.method);
    if (!method.has_value()) {
      return Refuse(absl::InvalidArgumentError(absl::StrCat("no data-path method numbered ", header.method)));
    }
    if (header.lead > socket_plane::kMaxLead) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("a request led by ", header.lead, " bytes of padding (at most ", socket_plane::kMaxLead, ")")));
    }
    if (header.length > static_cast<uint64_t>(plane_->options_.max_message_bytes)) {
      return Refuse(absl::ResourceExhaustedError(
          absl::StrCat("a request of ", header.length, " bytes: over the limit of ", plane_->options_.max_message_bytes,
                       " (summa-server --max_message_bytes)")));
    }
    BodyBuffers::Lease lease;
    char* body;
    std::optional<absl::string_view> elsewhere;  // the message's values, in the values segment
    if (in_segment) {
      // Read where the client placed it: the handler sums straight out of the segment.
      absl::StatusOr<absl::Span<char>> request = shm_.Request(header);
      if (!request.ok()) return Refuse(request.status());
      if (values_elsewhere) {
        if (request->size() < socket_plane::kValuesPlaceBytes) {
          return Refuse(absl::InvalidArgumentError("a request naming values elsewhere without their place"));
        }
        absl::StatusOr<absl::string_view> values = shm_.Values(request->subspan(0, socket_plane::kValuesPlaceBytes));
        if (!values.ok()) return Refuse(values.status());
        elsewhere = *values;
        plane_->values_in_place_.fetch_add(1, std::memory_order_relaxed);
        *request = request->subspan(socket_plane::kValuesPlaceBytes);
        header.length -= socket_plane::kValuesPlaceBytes;
      }
      body = request->data();
      plane_->requests_in_segments_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // A buffer from the plane's few: what the server holds of requests is bounded by them, not
      // by its connections (the rest wait in the kernel's socket buffers, as HTTP/2's flow control
      // would hold them).
      lease = plane_->bodies_->Take();
      char* const lead = lease->Resize(header.lead + header.length);  // a 16-byte boundary
      SUMMA_RETURN_IF_ERROR(
          link_.ReadFull(lead, header.lead + header.length, absl::Now() + BodyTimeout(header.length), "a request"));
      body = lead + header.lead;
    }
    grpc::Slice slice(body, header.length, grpc::Slice::STATIC_SLICE);
    const grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    SocketCall call(peer_, authorization_, absl::MakeSpan(body, header.length), request, &response, wake_.get(),
                    in_segment, elsewhere);
    plane_->service_->ServeData(*method, &call);
    // The handler is done with the request (its values are summed, applied or copied before it
    // returns, as on gRPC's path, whose per-thread buffer the next call reuses).
    lease = BodyBuffers::Lease();
    AwaitAnswer(call);
    const grpc::Status status = call.status();
    // A reply of values waits for its worker's turn (ReplyTurns); a refusal goes at once.
    const bool ordered = status.ok() && !call.reply_worker().empty();
    ReplyTurns::Turn turn;
    if (ordered) turn = plane_->turns_.Take(call.reply_worker(), call.reply_partition());
    TraceSpan span(ordered ? plane_->options_.tracer : nullptr, "reply", "server", call.reply_partition());
    return Reply(status, response);
  }

  // Waits for `call`'s answer; a client that closes its connection meanwhile cancels the call
  // (which answers it).
  void AwaitAnswer(SocketCall& call) {
    bool cancelled = false;
    for (;;) {
      pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {link_.fd(), POLLRDHUP, 0}};
      const int ready = ::poll(fds, cancelled ? 1 : 2, -1);
      if (ready < 0) continue;  // EINTR; poll fails otherwise only for bad arguments
      if (fds[0].revents & POLLIN) {
        uint64_t count;
        while (::read(wake_.get(), &count, sizeof(count)) < 0 && errno == EINTR) {
        }
        return;
      }
      if (!cancelled && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        cancelled = true;
        call.OnCancelled();
      }
    }
  }

  absl::Status Reply(const grpc::Status& status, const grpc::ByteBuffer& response) {
    replied_ = true;
    if (shm_.attached() && status.ok() && response.Valid()) {
      if (std::optional<absl::Status> sent =
              shm_.Reply(link_.fd(), response, absl::Now() + kFrameTimeout, &plane_->replies_in_segments_);
          sent.has_value()) {
        return *sent;
      }
    }
    return WriteReply(link_, status, response, absl::Now() + kFrameTimeout, slices_, iov_, details_ok_);
  }


  SocketPlane* const plane_;
  const std::string peer_;
  const std::string source_;  // peer_ without its port: what the per-source bound counts
  const absl::Time hello_deadline_;
  // kHello until the connection's thread passes its hello (kPassed) or the acceptor evicts it
  // (kEvicted), whichever comes first; then never again.
  enum class Phase { kHello, kPassed, kEvicted };
  std::atomic<Phase> phase_{Phase::kHello};
  absl::Mutex fd_mu_;  // Close (another thread) against the thread's own close at its end
  socket_plane::Link link_;  // the socket, and TLS over it on a TLS plane
  const OwnedFd wake_;  // the answer's signal (an eventfd)
  std::string authorization_;  // from the hello
  bool details_ok_ = false;    // its hello's kHelloRefusalDetails: refusals carry their details
  bool replied_ = false;       // a reply was written (a refusal, the hello's): the thread's alone
  std::vector<grpc::Slice> slices_;
  std::vector<iovec> iov_;
  ShmSegments shm_;  // the shared-memory plane's: attached after the hello
  std::thread thread_;
  std::atomic<bool> done_{false};
};

absl::StatusOr<std::unique_ptr<SocketPlane>> SocketPlane::Start(const std::string& address,
                                                                ParameterServerService* service,
                                                                const TokenCheck* tokens,
                                                                const SocketPlaneOptions& options) {
  std::unique_ptr<SocketPlane> plane(new SocketPlane(service, tokens, options));
  if (options.tls.enabled() && options.shm_socket.empty()) {
    absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> tls =
        socket_plane::TlsContext::Create(options.tls, /*server=*/true);
    if (!tls.ok()) {
      return absl::Status(tls.status().code(), absl::StrCat("the data plane (--data_address): ", tls.status().message()));
    }
    plane->tls_ = *std::move(tls);
  }
  if (!options.shm_socket.empty()) {
    // The seals the plane relies on (F_SEAL_FUTURE_WRITE: Linux 5.1), tried now rather than at
    // a worker's first attach.
    if (absl::StatusOr<SharedSegment> tried = SharedSegment::Create("summa-probe", 1, /*writable_by_others=*/false);
        !tried.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shared-memory plane (--shm_socket) needs sealed memfds (Linux 5.1 or later): ", tried.status().message()));
    }
    Snapshot::ShareLargeBuffers();
  }
  absl::StatusOr<OwnedFd> listener = options.shm_socket.empty()
                                          ? socket_plane::Listen(address, &plane->port_)
                                          : socket_plane::ListenUnix(options.shm_socket, 0666);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat(options.shm_socket.empty() ? "the data plane (--data_address): "
                                                                : "the shared-memory plane (--shm_socket): ",
                                     listener.status().message()));
  }
  plane->listener_ = *std::move(listener);
  if (struct stat bound = {}; plane->shm() && ::stat(options.shm_socket.c_str(), &bound) == 0) {
    plane->socket_inode_ = {bound.st_dev, bound.st_ino};
  }
  plane->acceptor_ = std::thread([p = plane.get()] { p->AcceptLoop(); });
  return plane;
}

SocketPlane::SocketPlane(ParameterServerService* service, const TokenCheck* tokens,
                         const SocketPlaneOptions& options)
    : service_(service),
      tokens_(tokens),
      options_(options),
      bodies_(std::make_unique<BodyBuffers>(
          std::clamp(2 * static_cast<int>(std::thread::hardware_concurrency()), kMinBodyBuffers, kMaxBodyBuffers))),
      hellos_failed_(std::make_unique<Tally>()),
      evictions_(std::make_unique<Tally>()) {}

SocketPlane::~SocketPlane() { Stop(); }

void SocketPlane::AcceptLoop() {
  std::vector<grpc::Slice> refusal_slices;  // WriteReply's, for refusals
  std::vector<iovec> refusal_iov;
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) return;
      }
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        SUMMA_LOG(WARNING) << "data plane: accept: " << std::strerror(errno);
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      SUMMA_LOG(ERROR) << "data plane: accept: " << std::strerror(errno) << "; no more connections taken";
      ::shutdown(listener_.get(), SHUT_RDWR);  // new ones are refused rather than left waiting
      return;
    }
    OwnedFd accepted(fd);
    socket_plane::SetNoDelay(fd);
    socket_plane::SetUnsentLimit(fd);
    const int one = 1;
    // A worker host that vanishes is noticed (its connection's thread and slot go).
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    Reap();
    auto refuse = [&](const std::string& message) {
      // A TLS client cannot read a refusal before its handshake, which would take a thread: it
      // only sees the connection close (UNAVAILABLE, "the peer closed the connection"), retries
      // a few times (SocketCalls::Open), then waits for a connection it has or fails.
      if (tls_ == nullptr) {
        socket_plane::Link plain(std::move(accepted));
        WriteReply(plain, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, message), grpc::ByteBuffer(),
                   absl::Now() + absl::Milliseconds(100), refusal_slices, refusal_iov)
            .IgnoreError();
      }
      SUMMA_LOG(WARNING) << "data plane: refused a connection: " << message;
    };
    // Connections without a token are held to the hello bounds: only members' fill this.
    if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      refuse(absl::StrCat("the data plane holds ", options_.max_connections,
                          " connections (summa-server --max_data_plane_connections)"));
      continue;
    }
    auto connection = std::make_unique<Connection>(this, std::move(accepted));
    MakeRoomInHello(connection->source());
    connections_.push_back(std::move(connection));
    try {
      connections_.back()->Start();
    } catch (const std::system_error& e) {  // no thread to be had (a pids limit, say)
      connections_.pop_back();
      SUMMA_LOG(WARNING) << "data plane: no thread for a connection: " << e.what();
    }
  }
}

void SocketPlane::NoteTls(const socket_plane::Link& link) {
  if (tls_noted_.exchange(true, std::memory_order_relaxed)) return;
  SUMMA_LOG(INFO) << "data plane: " << link.Describe() << "; kernel TLS (SSL_OP_ENABLE_KTLS) for sending "
                  << (link.kernel_tls_send() ? "on" : "off") << ", for receiving "
                  << (link.kernel_tls_receive() ? "on" : "off")
                  << (link.kernel_tls_send() ? "" : " (off: the kernel offers no \"tls\" ULP, or OpenSSL cannot use it)");
}

void SocketPlane::MakeRoomInHello(const std::string& source) {
  const HelloBounds bounds = {options_.max_connections_in_hello, options_.max_connections_in_hello_per_source};
  std::vector<Connection*> in_hello;
  std::vector<absl::string_view> sources;
  for (;;) {
    in_hello.clear();
    sources.clear();
    for (const auto& c : connections_) {  // oldest first
      if (!c->in_hello()) continue;
      in_hello.push_back(c.get());
      sources.push_back(c->source());
    }
    const std::optional<HelloEviction> evict =
        PickHelloEviction(sources, source, bounds, [&](size_t i) { return in_hello[i]->Silent(); });
    if (!evict.has_value()) return;
    Connection& victim = *in_hello[evict->index];
    // Its hello may have passed meanwhile: then it is out of the phase anyway, and kept.
    if (!victim.Evict()) continue;
    uint64_t since = 0;
    if (evictions_->Note(&since)) {
      const bool per_source = evict->bound == HelloBound::kPerSource;
      SUMMA_LOG(WARNING) << "data plane: closed a connection from " << victim.source() << " still in its hello"
                         << (evict->silent ? " (nothing sent yet)" : "") << " to make room for a newer one from "
                         << source << " under summa-server --max_data_plane_connections_in_hello"
                         << (per_source ? absl::StrCat("_per_source=", bounds.per_source)
                                        : absl::StrCat("=", bounds.total))
                         << (since > 1 ? absl::StrCat("; ", since, " such evictions since the last such line") : "");
    }
  }
}

uint64_t SocketPlane::hellos_failed() const { return hellos_failed_->total(); }
uint64_t SocketPlane::hello_evictions() const { return evictions_->total(); }

void SocketPlane::Reap() {
  auto ended = std::remove_if(connections_.begin(), connections_.end(),
                              [](const std::unique_ptr<Connection>& c) { return c->done(); });
  connections_.erase(ended, connections_.end());  // each joins its thread as it goes
}

int SocketPlane::connections() const {
  absl::MutexLock lock(&mu_);
  int open = 0;
  for (const auto& c : connections_) open += !c->done();
  return open;
}

void SocketPlane::Stop() {
  std::vector<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    connections.swap(connections_);
  }
  if (listener_.valid()) ::shutdown(listener_.get(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  // The socket goes, unless another server has put its own at the path since.
  if (struct stat now = {}; shm() && listener_.valid() && ::lstat(options_.shm_socket.c_str(), &now) == 0 &&
                            std::make_pair(now.st_dev, now.st_ino) == socket_inode_) {
    ::unlink(options_.shm_socket.c_str());
  }
  // Reading ends first, so that an answer being written (the last ones, from the hub's and the
  // core's shutdown) still reaches its client; writes still going after a while are cut.
  for (auto& c : connections) c->Close(SHUT_RD);
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  auto all_done = [&] {
    return std::all_of(connections.begin(), connections.end(), [](const auto& c) { return c->done(); });
  };
  while (!all_done() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  for (auto& c : connections) c->Close(SHUT_RDWR);
  connections.clear();  // joins every thread
}

}  // namespace summa::server
