#include "common/rpc/socket_tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace summa::socket_plane {
namespace {

// TLS 1.3's suites, fastest first where the CPU has AES-NI; the server's order decides.
constexpr char kSuites[] = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

// What OpenSSL's error queue says (and empties it).
std::string OpenSslReason() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    char code[256];
    if (reason == nullptr) ERR_error_string_n(e, code, sizeof(code));
    absl::StrAppend(&out, out.empty() ? "" : "; ", reason != nullptr ? reason : code);
  }
  return out.empty() ? "no reason given" : out;
}

// OpenSSL's socket BIO writes without MSG_NOSIGNAL (and a BIO of our own would give up kernel
// TLS), so a write to a peer that has gone would raise SIGPIPE, whose default ends the process.
// A process that speaks TLS on the plane ignores it, as servers do (nginx, Redis): the write fails
// with EPIPE instead. Masking it around each call would cost four system calls a record. A
// handler the process installed itself is left alone.
void IgnoreSigpipe() {
  static const bool ignored = [] {
    struct sigaction current = {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    }
    return true;
  }();
  (void)ignored;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeContext(const TlsFiles& f, bool server) {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()), SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS for the data plane: ", OpenSslReason()));
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  // A peer's close without close_notify is an end like any other: the frames' lengths tell a cut
  // message already, and OpenSSL would otherwise answer each close with an alert.
  SSL_CTX_set_options(c, SSL_OP_ENABLE_KTLS | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (SSL_CTX_set_ciphersuites(c, kSuites) != 1) {
    return absl::InternalError(absl::StrCat("TLS 1.3's suites: ", OpenSslReason()));
  }
  if (server) {
    // No resumption: a session ticket after the handshake would be a record that is not data,
    // which a socket under kernel TLS cannot take in a plain read.
    SSL_CTX_set_num_tickets(c, 0);
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  }
  if (!f.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(c, f.cert.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_cert ", f.cert, ": ", OpenSslReason()));
    }
    // OpenSSL checks the key against the certificate as it loads it ("key values mismatch").
    if (SSL_CTX_use_PrivateKey_file(c, f.key.c_str(), SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_key ", f.key, ": ", OpenSslReason()));
    }
  }
  if (!f.ca.empty()) {
    if (SSL_CTX_load_verify_locations(c, f.ca.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_ca ", f.ca, ": ", OpenSslReason()));
    }
    // gRPC's rule for its roots: a chain may end at any certificate in --tls_ca, an intermediate
    // CA's too (a cert-manager issuer), not only at a self-signed root.
    X509_STORE_set_flags(SSL_CTX_get_cert_store(c), X509_V_FLAG_PARTIAL_CHAIN | X509_V_FLAG_TRUSTED_FIRST);
  }
  if (server) {
    // gRPC's rule (common/rpc/transport.cc): a server given a CA requires client certificates
    // that chain to it.
    if (!f.ca.empty()) SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  } else {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  }
  return ctx;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsContext>> TlsContext::Create(const TlsFiles& files, bool server) {
  if (absl::Status valid = ValidateTls(files, server); !valid.ok()) return valid;
  IgnoreSigpipe();
  std::unique_ptr<TlsContext> tls(new TlsContext(files, server));
  const std::string stamp = tls->Stamp();
  absl::StatusOr<std::shared_ptr<SSL_CTX>> made = MakeContext(files, server);
  if (!made.ok()) return made.status();
  absl::MutexLock lock(&tls->mu_);
  tls->context_ = *std::move(made);
  tls->stamp_ = stamp;
  tls->looked_ = absl::Now();
  return tls;
}

TlsContext::~TlsContext() = default;

std::string TlsContext::Stamp() const {
  std::string stamp;
  for (const std::string* path : {&files_.cert, &files_.key, &files_.ca}) {
    struct stat s = {};
    if (path->empty() || ::stat(path->c_str(), &s) != 0) {
      stamp += "-;";
      continue;
    }
    absl::StrAppend(&stamp, s.st_ino, ":", s.st_size, ":", s.st_mtim.tv_sec, ".", s.st_mtim.tv_nsec, ";");
  }
  return stamp;
}

std::shared_ptr<SSL_CTX> TlsContext::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - looked_ < absl::Seconds(kCertificateRefreshSeconds)) return context_;
  looked_ = now;
  std::string stamp = Stamp();
  if (stamp == stamp_) return context_;
  stamp_ = std::move(stamp);  // a bad change is reported once, not every few seconds
  absl::StatusOr<std::shared_ptr<SSL_CTX>> made = MakeContext(files_, server_);
  if (!made.ok()) {
    SUMMA_LOG(WARNING) << "the data plane's TLS files changed but cannot be used (the last good ones stay): "
                       << made.status().message();
    return context_;
  }
  context_ = *std::move(made);
  SUMMA_LOG(INFO) << "the data plane's TLS files changed: new connections use them";
  return context_;
}

Link::Link() = default;
Link::Link(OwnedFd fd) : fd_(std::move(fd)) {}
Link::~Link() { Reset(); }

Link::Link(Link&& other) noexcept { *this = std::move(other); }

Link& Link::operator=(Link&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::move(other.fd_);
    ssl_ = std::exchange(other.ssl_, nullptr);
    staging_ = std::move(other.staging_);
    pending_ = std::exchange(other.pending_, nullptr);
    pending_bytes_ = std::exchange(other.pending_bytes_, 0);
  }
  return *this;
}

void Link::Reset() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  pending_ = nullptr;
  pending_bytes_ = 0;
  fd_.Reset();
}

bool Link::kernel_tls_send() const {
#ifdef BIO_get_ktls_send
  return ssl_ != nullptr && BIO_get_ktls_send(SSL_get_wbio(ssl_));
#else
  return false;
#endif
}

bool Link::kernel_tls_receive() const {
#ifdef BIO_get_ktls_recv
  return ssl_ != nullptr && BIO_get_ktls_recv(SSL_get_rbio(ssl_));
#else
  return false;
#endif
}

std::string Link::Describe() const {
  if (ssl_ == nullptr) return "plaintext";
  return absl::StrCat(SSL_get_version(ssl_), " ", SSL_get_cipher_name(ssl_));
}

absl::Status Link::SslError(int result, absl::string_view what, short* wait) {
  const int error = SSL_get_error(ssl_, result);
  switch (error) {
    case SSL_ERROR_WANT_READ:
      *wait = POLLIN;
      return absl::OkStatus();
    case SSL_ERROR_WANT_WRITE:
      *wait = POLLOUT;
      return absl::OkStatus();
    case SSL_ERROR_ZERO_RETURN:
      return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
    case SSL_ERROR_SYSCALL: {
      const int e = errno;
      ERR_clear_error();
      if (e == 0 || e == EPIPE || e == ECONNRESET) {
        return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
      }
      return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(e)));
    }
    default: {
      // (A close without close_notify is SSL_ERROR_ZERO_RETURN above: SSL_OP_IGNORE_UNEXPECTED_EOF.)
      std::string reason = OpenSslReason();
      const long verified = SSL_get_verify_result(ssl_);
      if (verified != X509_V_OK) absl::StrAppend(&reason, " (", X509_verify_cert_error_string(verified), ")");
      // TLS refused the peer (a certificate that does not verify, none where one is required, no
      // TLS 1.3): not a connection that dropped, so UNAUTHENTICATED, which no one retries.
      return absl::UnauthenticatedError(absl::StrCat(what, ": TLS: ", reason));
    }
  }
}

absl::Status Link::StartTls(TlsContext& context, const std::string& host, absl::Time deadline) {
  const std::shared_ptr<SSL_CTX> ctx = context.Current();
  ERR_clear_error();
  ssl_ = SSL_new(ctx.get());  // holds its own reference to the context
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_.get()) != 1) {
    return absl::InternalError(absl::StrCat("TLS for the data plane: ", OpenSslReason()));
  }
  if (context.server()) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
    in6_addr ip;
    const bool literal = ::inet_pton(AF_INET, host.c_str(), &ip) == 1 || ::inet_pton(AF_INET6, host.c_str(), &ip) == 1;
    // The server's certificate must name the host the client asked for, as gRPC checks.
    const bool named = literal ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), host.c_str()) == 1
                               : SSL_set1_host(ssl_, host.c_str()) == 1 &&
                                     SSL_set_tlsext_host_name(ssl_, host.c_str()) == 1;
    if (!named) return absl::InvalidArgumentError(absl::StrCat("TLS: cannot check a certificate for '", host, "'"));
  }
  staging_ = std::make_unique<char[]>(kRecordBytes);
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int done = SSL_do_handshake(ssl_);
    if (done == 1) return absl::OkStatus();
    short wait = 0;
    if (absl::Status failed = SslError(done, "the TLS handshake", &wait); !failed.ok()) return failed;
    if (absl::Status ready = Await(fd_.get(), wait, deadline, "the TLS handshake"); !ready.ok()) return ready;
  }
}

absl::StatusOr<size_t> Link::Receive(char* data, size_t size, short* wait) {
  *wait = 0;
  if (ssl_ == nullptr) {
    for (;;) {
      const ssize_t n = ::recv(fd_.get(), data, size, MSG_DONTWAIT);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return absl::UnavailableError("the peer closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *wait = POLLIN;
        return 0;
      }
      return absl::UnavailableError(std::strerror(errno));
    }
  }
  ERR_clear_error();
  errno = 0;
  size_t n = 0;
  const int read = SSL_read_ex(ssl_, data, size, &n);
  if (read == 1) return n;
  if (absl::Status failed = SslError(read, "receiving", wait); !failed.ok()) return failed;
  return 0;
}

absl::StatusOr<size_t> Link::Send(const iovec* iov, int count, short* wait) {
  *wait = 0;
  if (ssl_ == nullptr) {
    for (;;) {
      msghdr m = {};
      m.msg_iov = const_cast<iovec*>(iov);
      m.msg_iovlen = static_cast<size_t>(std::min(count, IOV_MAX));
      const ssize_t n = ::sendmsg(fd_.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        if (n == 0) *wait = POLLOUT;
        return static_cast<size_t>(n);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *wait = POLLOUT;
        return 0;
      }
      return absl::UnavailableError(std::strerror(errno));
    }
  }
  if (pending_bytes_ == 0) {
    // A large piece goes as it is, cut into records by OpenSSL; small ones (a frame's header, a
    // status message, a short request) are gathered into one record rather than each taking
    // one of its own.
    if (count > 0 && iov[0].iov_len >= kRecordBytes) {
      pending_ = static_cast<const char*>(iov[0].iov_base);
      pending_bytes_ = iov[0].iov_len;
    } else {
      size_t staged = 0;
      for (int k = 0; k < count && staged < kRecordBytes; ++k) {
        const size_t take = std::min(iov[k].iov_len, kRecordBytes - staged);
        std::memcpy(staging_.get() + staged, iov[k].iov_base, take);
        staged += take;
      }
      if (staged == 0) return 0;
      pending_ = staging_.get();
      pending_bytes_ = staged;
    }
  }
  ERR_clear_error();
  errno = 0;
  size_t written = 0;
  const int wrote = SSL_write_ex(ssl_, pending_, pending_bytes_, &written);
  if (wrote == 1) {
    // Without SSL_MODE_ENABLE_PARTIAL_WRITE a write succeeds only whole.
    pending_bytes_ = 0;
    return written;
  }
  absl::Status failed = SslError(wrote, "sending", wait);
  if (!failed.ok()) {
    pending_bytes_ = 0;
    return failed;
  }
  return 0;
}

absl::Status Link::ReadFull(char* data, size_t size, absl::Time deadline, absl::string_view what) {
  if (ssl_ == nullptr) return socket_plane::ReadFull(fd_.get(), data, size, deadline, what);
  for (size_t done = 0; done < size;) {
    short wait = 0;
    absl::StatusOr<size_t> n = Receive(data + done, size - done, &wait);
    if (!n.ok()) {
      return absl::Status(n.status().code(), absl::StrCat(what, " (", done, " of ", size, " bytes): ", n.status().message()));
    }
    done += *n;
    if (*n == 0) SUMMA_RETURN_IF_ERROR(Await(fd_.get(), wait, deadline, what));
  }
  return absl::OkStatus();
}

absl::Status Link::WriteFull(iovec* iov, int count, absl::Time deadline, absl::string_view what) {
  if (ssl_ == nullptr) return socket_plane::WriteFull(fd_.get(), iov, count, deadline, what);
  while (count > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --count;
      continue;
    }
    short wait = 0;
    absl::StatusOr<size_t> sent = Send(iov, count, &wait);
    if (!sent.ok()) return absl::Status(sent.status().code(), absl::StrCat(what, ": ", sent.status().message()));
    if (*sent == 0) {
      if (absl::Status ready = Await(fd_.get(), wait, deadline, what); !ready.ok()) {
        pending_bytes_ = 0;  // the caller's bytes are not to be retried after it has given up
        return ready;
      }
      continue;
    }
    for (size_t n = *sent; n > 0;) {
      const size_t take = std::min(n, iov->iov_len);
      iov->iov_base = static_cast<char*>(iov->iov_base) + take;
      iov->iov_len -= take;
      n -= take;
      if (iov->iov_len == 0) {
        ++iov;
        --count;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace summa::socket_plane
