// TLS for the socket data plane (common/rpc/socket_frame.h), with OpenSSL: the same PEM files, CA
// and mutual-TLS rules as the gRPC port (common/rpc/transport.h), TLS 1.3 only, AES-128-GCM first
// (the fastest suite with AES-NI, and one the kernel's TLS takes), and kernel TLS where the kernel
// offers it (SSL_OP_ENABLE_KTLS: the kernel then encrypts and decrypts in the socket's own copy).
// A connection's hello, token and calls run inside the tunnel unchanged.
//
// A Link is one end of a plane connection, plaintext or TLS: the server's connections and the
// client's calls read and write through it, so that the framing code is one for both.
#ifndef SUMMA_COMMON_RPC_SOCKET_TLS_H_
#define SUMMA_COMMON_RPC_SOCKET_TLS_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/transport.h"

struct ssl_st;
struct ssl_ctx_st;

namespace summa::socket_plane {

// The first byte a TLS client sends (a handshake record): a TLS plane that reads anything else
// answers in plaintext, so that a client without TLS learns why it is refused.
inline constexpr unsigned char kTlsHandshakeRecord = 0x16;

// An OpenSSL context for one end of the plane, made from `files` and made again when one of them
// changes (looked at no more often than every kCertificateRefreshSeconds, as gRPC's file watcher
// does); a remade context that fails keeps the last good one (logged). Thread-safe.
class TlsContext {
 public:
  // A server's: its certificate and key; with a CA, client certificates are required and must
  // chain to it (mutual TLS). A client's: the CA it trusts, and its certificate and key for mutual
  // TLS. INVALID_ARGUMENT naming the flag and OpenSSL's reason when a file cannot be used.
  static absl::StatusOr<std::unique_ptr<TlsContext>> Create(const TlsFiles& files, bool server);
  ~TlsContext();

  // The context a new connection starts from (the newest good one).
  std::shared_ptr<ssl_ctx_st> Current();
  bool server() const { return server_; }

 private:
  TlsContext(const TlsFiles& files, bool server) : files_(files), server_(server) {}
  // The files' change times and sizes, as a string that differs when any file changed.
  std::string Stamp() const;

  const TlsFiles files_;
  const bool server_;
  absl::Mutex mu_;
  std::shared_ptr<ssl_ctx_st> context_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time looked_ ABSL_GUARDED_BY(mu_);
};

// One end of a plane connection: its socket (non-blocking), and the TLS session over it once
// StartTls has run. Not thread-safe, except fd(), which Close-like shutdowns from other threads
// may read.
class Link {
 public:
  Link();
  explicit Link(OwnedFd fd);
  ~Link();
  Link(Link&& other) noexcept;
  Link& operator=(Link&& other) noexcept;

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  bool tls() const { return ssl_ != nullptr; }
  // Whether the kernel encrypts what this end sends, and decrypts what it receives (kernel TLS).
  bool kernel_tls_send() const;
  bool kernel_tls_receive() const;
  // The TLS version and suite ("TLSv1.3 TLS_AES_128_GCM_SHA256"), or "plaintext".
  std::string Describe() const;
  // Closes the socket (and drops the session).
  void Reset();

  // Makes this a TLS link and completes the handshake by `deadline`: as the server, or as a
  // client that checks the server's certificate is for `host` (a DNS name or an IP address).
  // UNAUTHENTICATED naming OpenSSL's reason when TLS refuses the peer (a certificate that does not
  // verify, none where one is required, a peer that speaks no TLS 1.3; on later reads and writes
  // too, where TLS reports the refusal after the handshake); DEADLINE_EXCEEDED; UNAVAILABLE when
  // the peer closes or the socket fails.
  absl::Status StartTls(TlsContext& context, const std::string& host, absl::Time deadline);

  // Non-blocking: moves what it can now, and returns how many bytes; 0 when none can move now,
  // with `*wait` set to what to poll the socket for (POLLIN or POLLOUT: TLS may need to read
  // to write and the other way round). UNAVAILABLE when the peer has closed or the connection
  // failed. Send takes the bytes of `iov` in order; a TLS link may hold some back to retry
  // (OpenSSL's rule: a write it could not finish is retried with the same bytes), reporting them
  // sent only once they are.
  absl::StatusOr<size_t> Receive(char* data, size_t size, short* wait);
  absl::StatusOr<size_t> Send(const iovec* iov, int count, short* wait);
  // Blocking until every byte has moved or `deadline` (InfiniteFuture: none), as ReadFull and
  // WriteFull (common/rpc/socket_frame.h) do on a socket; `what` names the bytes in messages.
  absl::Status ReadFull(char* data, size_t size, absl::Time deadline, absl::string_view what);
  absl::Status WriteFull(iovec* iov, int count, absl::Time deadline, absl::string_view what);

  // Bytes a TLS write coalesces small pieces into: one full record.
  static constexpr size_t kRecordBytes = 16 << 10;

 private:
  absl::Status SslError(int result, absl::string_view what, short* wait);

  OwnedFd fd_;
  ssl_st* ssl_ = nullptr;
  std::unique_ptr<char[]> staging_;  // small pieces of a write, gathered into one record
  const char* pending_ = nullptr;   // a write OpenSSL asked to retry: these bytes, again
  size_t pending_bytes_ = 0;
};

}  // namespace summa::socket_plane

#endif  // SUMMA_COMMON_RPC_SOCKET_TLS_H_
