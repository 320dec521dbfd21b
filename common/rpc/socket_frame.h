// The socket data plane: summa.v1's data-path calls (Initialize, Push, Pull, PushPull,
// AllReduce) over a TCP connection of their own, beside gRPC: plaintext, or TLS 1.3 for a server
// with TLS (common/rpc/socket_tls.h; everything below then runs inside the tunnel). A call's
// request and reply are the very bytes gRPC would carry (the summa.v1 messages, common/rpc/wire.h),
// framed by a 16-byte header instead of HTTP/2: no streams, no flow-control windows, no hand-over
// between threads. gRPC's own path stays for every call and every job; a server with a data plane
// says where it is and whether it speaks TLS (the DataPlane RPC), and a client uses it where offered.
//
// On a connection, all integers little-endian:
//   hello (client):  "SUMMADP1", u32 length of the authorization value, u32 flags (0 from a client
//                    before them, ignored by a server before them: kHelloRefusalDetails), the value
//                    ("Bearer <token>", or nothing)
//   answer (server): a reply header with length 0: OK, or why the connection is refused (then
//                    closed)
//   request:         u32 DataMethod, u32 lead, u64 length, `lead` bytes of padding (at most
//                    kMaxLead: the sender's choice, so that the message's values land on a
//                    4-byte boundary, where the server reads them in place), the request message
//   reply:           u32 status code, u32 length of the status message, u64 length of the reply
//                    message, the status message, the reply message when OK; when not, a
//                    serialized summa.v1.RpcStatus with the refusal's reason (common/rpc/grpc_status.h),
//                    or nothing
// One call at a time on a connection; a client with calls in flight at once opens as many
// connections. A client that closes its connection cancels its call.
//
// The shared-memory plane (a client on the server's host): the same frames on a Unix socket
// (its path in the DataPlane reply), never TLS, with the large bytes in shared segments
// (common/shared_segment.h) instead of on the socket. The server speaks first: u64 its instance
// (DataPlaneResponse.shm_instance), which the client checks before its hello, so that a token
// never goes to a socket someone else put at that path. After the hello's answer:
//   attach (client): u64 request segment bytes, u64 reply segment bytes asked for, with the
//                    request segment's memfd (SCM_RIGHTS): sealed against shrinking, its size
//                    the one declared, at most the server's --max_message_bytes plus kMaxLead
//   answer (server): a reply header, OK with a 16-byte body: u64 reply segment bytes (at most
//                    those asked for), u64 the server's instance (DataPlaneResponse.shm_instance:
//                    proof that the socket reached the server the client asked), with the reply
//                    segment's read-only memfd (SCM_RIGHTS); or a refusal, and the connection
//                    closes
//   request:         the method's number with kInSegment set: the request message is at
//                    [lead, lead + length) of the request segment and nothing follows the header
//                    (without the bit: on the socket, as above, for a message that does not fit)
//   reply:           the code with kInSegment set: the reply message is at [0, length) of the
//                    reply segment, only the status message follows the header (without the bit:
//                    on the socket, as above). With kPieces set too, the message is pieces of
//                    segments, listed after the header: u32 count, u32 0, then count pieces of
//                    u64 segment (0: the reply segment; else a segment the server publishes its
//                    weights and sums in, common/shared_segment.h), u64 offset, u64 length, u64
//                    the segment's size; the message is the pieces' bytes in order, and each piece
//                    of a published segment comes with that segment's read-only descriptor
//                    (SCM_RIGHTS, in the pieces' order, beside the header). A client maps a
//                    published segment once and keeps it; the server does not write what a
//                    reply names until the connection's next request.
//   release:         a request header with method kReleaseReply and nothing else: the client is
//                    done with the last reply, the server may write what it named; no answer
// A segment is the connection's, one call at a time: the client writes its request segment only
// between calls, and reads a reply in the reply segment before its connection's next call (or
// release).
#ifndef SUMMA_COMMON_RPC_SOCKET_FRAME_H_
#define SUMMA_COMMON_RPC_SOCKET_FRAME_H_

#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "common/rpc/data_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace summa::socket_plane {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the frames are read and written in host order");

inline constexpr char kHelloMagic[8] = {'S', 'U', 'M', 'M', 'A', 'D', 'P', '1'};
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kHelloBytes = 16;
// The longest authorization value a hello may carry, and the longest status message.
inline constexpr uint32_t kMaxAuthorizationBytes = 8 << 10;
inline constexpr uint32_t kMaxStatusMessageBytes = 64 << 10;

// A request's method is a DataMethod's number (common/rpc/data_method.h).
using ::summa::DataMethod;

struct RequestHeader {
  uint32_t method = 0;  // a DataMethod, unchecked
  uint64_t length = 0;
  uint32_t lead = 0;    // padding bytes between the header and the message, unchecked
};
inline constexpr uint32_t kMaxLead = 64;
// The lead that puts the values of a message whose fields before them take `prefix_bytes` on a
// 4-byte boundary (the message itself starting on one).
inline uint32_t LeadFor(size_t prefix_bytes) { return static_cast<uint32_t>((4 - prefix_bytes % 4) % 4); }
struct ReplyHeader {
  uint32_t code = 0;  // an absl::StatusCode
  uint32_t message_length = 0;
  uint64_t length = 0;
};
// The shared-memory plane's flag, in a request header's method and a reply header's code.
inline constexpr uint32_t kInSegment = uint32_t{1} << 31;
inline constexpr uint32_t kPieces = uint32_t{1} << 30;  // a reply's code, with kInSegment
inline constexpr size_t kPieceBytes = 32;
inline constexpr uint32_t kMaxPieces = 64;
// The attach and its answer's body; the server's first words.
inline constexpr size_t kAttachBytes = 16;
inline constexpr size_t kInstanceBytes = 8;
inline constexpr uint32_t kReleaseReply = ~uint32_t{0};
// The values segment: a request header with this method (length: the segment's size, no body)
// carries a memfd beside it, a worker's flat buffer of values that its later requests on this
// connection may name instead of copying (kValuesElsewhere). Answered OK, or refused (the
// connection stays, and its requests carry their values as before).
inline constexpr uint32_t kAttachValues = ~uint32_t{0} - 1;
// A request's method flag, with kInSegment: the message's values are not in the request segment
// but in the values segment. The request segment holds, at the lead, the values' offset and
// length there (u64 each, kValuesPlaceBytes), then the message up to its values (which are its
// last bytes: the values field's tag and length end it).
inline constexpr uint32_t kValuesElsewhere = uint32_t{1} << 29;
inline constexpr size_t kValuesPlaceBytes = 16;
void EncodeRequestHeader(const RequestHeader& header, char out[kHeaderBytes]);
RequestHeader DecodeRequestHeader(const char in[kHeaderBytes]);
void EncodeReplyHeader(const ReplyHeader& header, char out[kHeaderBytes]);
ReplyHeader DecodeReplyHeader(const char in[kHeaderBytes]);
// The hello's flags. kHelloRefusalDetails: this client reads a refusal's body as its details
// (common/rpc/grpc_status.h); a server sends a body with a refusal only to such a client, so that
// an older client, which takes a refusal with a body for a malformed reply, still works.
inline constexpr uint32_t kHelloRefusalDetails = 1;
// The hello's fixed part; its authorization value follows it.
void EncodeHello(uint32_t authorization_length, char out[kHelloBytes], uint32_t flags = kHelloRefusalDetails);
// The hello's flags (0 from a client before them).
uint32_t HelloFlags(const char in[kHelloBytes]);
// The authorization value's length, or INVALID_ARGUMENT: not a hello (another protocol, another
// version), or a value over kMaxAuthorizationBytes.
absl::StatusOr<uint32_t> DecodeHello(const char in[kHelloBytes]);

// A file descriptor, closed when this goes away.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  ~OwnedFd() { Reset(); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();
  // Gives the descriptor up to the caller, who closes it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Reads exactly `size` bytes (a blocking or non-blocking descriptor), waiting at most until
// `deadline` (InfiniteFuture: no limit). UNAVAILABLE when the peer closes or the read fails,
// DEADLINE_EXCEEDED at the deadline; `what` names the bytes in the message.
absl::Status ReadFull(int fd, char* data, size_t size, absl::Time deadline, absl::string_view what);
// Waits until `fd` is ready for `events` (poll's); DEADLINE_EXCEEDED at `deadline`.
absl::Status Await(int fd, short events, absl::Time deadline, absl::string_view what);
// Writes every byte of `iov` (which it advances) likewise.
absl::Status WriteFull(int fd, iovec* iov, int count, absl::Time deadline, absl::string_view what);

// A listening TCP socket on "host:port" (port 0: the system picks; host empty or "[::]": every
// address), and the port it got. INVALID_ARGUMENT for an address that is not host:port,
// UNAVAILABLE when it cannot listen.
absl::StatusOr<OwnedFd> Listen(const std::string& address, int* port);
// A connected TCP socket to host:port, non-blocking, TCP_NODELAY; UNAVAILABLE or
// DEADLINE_EXCEEDED naming the address.
absl::StatusOr<OwnedFd> Connect(const std::string& host, int port, absl::Time deadline);
// A listening Unix stream socket at `path` (a socket left there by an earlier process is
// replaced; any other file is not), its mode `mode`. INVALID_ARGUMENT for a path too long for a
// socket, UNAVAILABLE when it cannot listen.
absl::StatusOr<OwnedFd> ListenUnix(const std::string& path, unsigned mode);
// A connected Unix stream socket to `path`, non-blocking; UNAVAILABLE naming the path.
absl::StatusOr<OwnedFd> ConnectUnix(const std::string& path, absl::Time deadline);
// Writes `size` bytes with descriptor `pass` beside them (SCM_RIGHTS; -1: none), by `deadline`.
absl::Status SendWithFd(int fd, const char* data, size_t size, int pass, absl::Time deadline, absl::string_view what);
// The same with any number of descriptors (at most kMaxPassedFds) beside the bytes.
inline constexpr size_t kMaxPassedFds = 64;
absl::Status SendWithFds(int fd, const char* data, size_t size, absl::Span<const int> pass, absl::Time deadline,
                         absl::string_view what);
// Non-blocking: receives up to `size` bytes now, appending descriptors sent beside them to
// `received`; 0 when none can be read now. UNAVAILABLE when the peer has closed.
absl::StatusOr<size_t> ReceiveSome(int fd, char* data, size_t size, std::vector<OwnedFd>* received);
// Reads exactly `size` bytes, as ReadFull, taking a descriptor sent beside them into `*received`
// (the caller's to close; -1 when none came; any more are closed).
absl::Status ReceiveWithFd(int fd, char* data, size_t size, OwnedFd* received, absl::Time deadline,
                           absl::string_view what);
// The user id of a Unix socket's peer, or -1.
int PeerUid(int fd);

// Turns TCP's small-write delay off (a call's frame header and its message are separate writes).
void SetNoDelay(int fd);

// Holds at most kMaxUnsentBytes unsent in `fd`'s kernel buffer (TCP_NOTSENT_LOWAT): a write
// that has returned has its bytes on their way, not queued behind megabytes that buffer
// autotuning allows. Both ends of the plane send their frames in an order (a shard's requests
// in the order of their calls, a worker's replies the earliest partition first), and that
// order is the order on the link only when the kernel does not hold much of each at once.
void SetUnsentLimit(int fd);
inline constexpr int kMaxUnsentBytes = 256 << 10;

// The host of a "host:port" address (a bracketed IPv6 host without its brackets), or
// INVALID_ARGUMENT.
absl::StatusOr<std::string> HostOf(absl::string_view address);

// `message`'s slices as iovecs after `header` (kept in `slices`, which own them while the iovecs
// are used).
void Gather(const grpc::ByteBuffer& message, char* header, size_t header_bytes, std::vector<grpc::Slice>& slices,
            std::vector<iovec>& iov);

}  // namespace summa::socket_plane

#endif  // SUMMA_COMMON_RPC_SOCKET_FRAME_H_
