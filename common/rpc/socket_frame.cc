#include "common/rpc/socket_frame.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace summa::socket_plane {
namespace {

template <typename T>
void Put(char*& out, T value) {
  std::memcpy(out, &value, sizeof(value));
  out += sizeof(value);
}
template <typename T>
T Get(const char*& in) {
  T value;
  std::memcpy(&value, in, sizeof(value));
  in += sizeof(value);
  return value;
}

absl::Status ErrnoStatus(int error, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
}

// Milliseconds for poll until `deadline`: -1 for none, at least 0.
int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now()) + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Splits "host:port" ("[v6]:port" too); the host may be empty.
absl::Status SplitAddress(absl::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  return absl::OkStatus();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { ::freeaddrinfo(info); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfo> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int error = ::getaddrinfo(host.empty() || host == "::" ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(error)));
  }
  return AddrInfo(found);
}

}  // namespace

absl::Status Await(int fd, short events, absl::Time deadline, absl::string_view what) {
  for (;;) {
    pollfd p = {fd, events, 0};
    const int ready = ::poll(&p, 1, PollMs(deadline));
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return ErrnoStatus(errno, what);
    if (ready == 0 && absl::Now() >= deadline) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
  }
}

void EncodeRequestHeader(const RequestHeader& header, char out[kHeaderBytes]) {
  Put<uint32_t>(out, header.method);
  Put<uint32_t>(out, header.lead);
  Put<uint64_t>(out, header.length);
}

RequestHeader DecodeRequestHeader(const char in[kHeaderBytes]) {
  RequestHeader header;
  header.method = Get<uint32_t>(in);
  header.lead = Get<uint32_t>(in);
  header.length = Get<uint64_t>(in);
  return header;
}

void EncodeReplyHeader(const ReplyHeader& header, char out[kHeaderBytes]) {
  Put<uint32_t>(out, header.code);
  Put<uint32_t>(out, header.message_length);
  Put<uint64_t>(out, header.length);
}

ReplyHeader DecodeReplyHeader(const char in[kHeaderBytes]) {
  ReplyHeader header;
  header.code = Get<uint32_t>(in);
  header.message_length = Get<uint32_t>(in);
  header.length = Get<uint64_t>(in);
  return header;
}

void EncodeHello(uint32_t authorization_length, char out[kHelloBytes], uint32_t flags) {
  std::memcpy(out, kHelloMagic, sizeof(kHelloMagic));
  out += sizeof(kHelloMagic);
  Put<uint32_t>(out, authorization_length);
  Put<uint32_t>(out, flags);
}

uint32_t HelloFlags(const char in[kHelloBytes]) {
  const char* flags = in + sizeof(kHelloMagic) + 4;
  return Get<uint32_t>(flags);
}

absl::StatusOr<uint32_t> DecodeHello(const char in[kHelloBytes]) {
  if (std::memcmp(in, kHelloMagic, sizeof(kHelloMagic)) != 0) {
    return absl::InvalidArgumentError("not a Summa data-plane hello (\"SUMMADP1\"): another protocol or version");
  }
  in += sizeof(kHelloMagic);
  const uint32_t length = Get<uint32_t>(in);
  if (length > kMaxAuthorizationBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an authorization value of ", length, " bytes (at most ",
                                                   kMaxAuthorizationBytes, ")"));
  }
  return length;
}

void OwnedFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status ReadFull(int fd, char* data, size_t size, absl::Time deadline, absl::string_view what) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat(what, ": the connection closed after ", done, " of ", size, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(errno, what);
    if (absl::Status ready = Await(fd, POLLIN, deadline, what); !ready.ok()) return ready;
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, iovec* iov, int count, absl::Time deadline, absl::string_view what) {
  while (count > 0) {
    msghdr message = {};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(std::min(count, IOV_MAX));
    ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(errno, what);
      if (absl::Status ready = Await(fd, POLLOUT, deadline, what); !ready.ok()) return ready;
      continue;
    }
    while (count > 0 && static_cast<size_t>(n) >= iov->iov_len) {
      n -= static_cast<ssize_t>(iov->iov_len);
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + n;
      iov->iov_len -= static_cast<size_t>(n);
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' cannot name a Unix socket (1 to ",
                                                   sizeof(address.sun_path) - 1, " bytes)"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

}  // namespace

absl::StatusOr<OwnedFd> ListenUnix(const std::string& path, unsigned mode) {
  absl::StatusOr<sockaddr_un> address = UnixAddress(path);
  if (!address.ok()) return address.status();
  struct stat st = {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": a file that is not a socket is there"));
    }
    // A socket nobody listens on is an earlier server's, left by a crash: it goes. One that
    // takes a connection is a live server's.
    OwnedFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() && ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": another process listens there"));
    }
    ::unlink(path.c_str());
  }
  OwnedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "a Unix socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0 ||
      ::chmod(path.c_str(), mode) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot listen on ", path));
  }
  return fd;
}

absl::StatusOr<OwnedFd> ConnectUnix(const std::string& path, absl::Time deadline) {
  absl::StatusOr<sockaddr_un> address = UnixAddress(path);
  if (!address.ok()) return address.status();
  const std::string what = absl::StrCat("connect to the shared-memory plane at ", path);
  OwnedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, what);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) == 0) return fd;
    if (errno == EINTR) continue;
    // A full backlog: the listener is busy accepting; try again shortly, within the deadline.
    if (errno == EAGAIN && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    return ErrnoStatus(errno, what);
  }
}

absl::Status SendWithFd(int fd, const char* data, size_t size, int pass, absl::Time deadline, absl::string_view what) {
  return SendWithFds(fd, data, size, pass < 0 ? absl::Span<const int>() : absl::Span<const int>(&pass, 1), deadline,
                     what);
}

absl::Status SendWithFds(int fd, const char* data, size_t size, absl::Span<const int> pass, absl::Time deadline,
                         absl::string_view what) {
  if (pass.size() > kMaxPassedFds) return absl::InvalidArgumentError(absl::StrCat(what, ": too many descriptors"));
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxPassedFds * sizeof(int))] = {};
  bool passed = pass.empty();
  for (size_t done = 0; done < size;) {
    iovec iov = {const_cast<char*>(data + done), size - done};
    msghdr message = {};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    if (!passed) {
      message.msg_control = control;
      message.msg_controllen = CMSG_SPACE(pass.size() * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&message);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(pass.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), pass.data(), pass.size() * sizeof(int));
    }
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(errno, what);
      SUMMA_RETURN_IF_ERROR(Await(fd, POLLOUT, deadline, what));
      continue;
    }
    passed = true;  // the descriptor went with the first bytes
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReceiveWithFd(int fd, char* data, size_t size, OwnedFd* received, absl::Time deadline,
                           absl::string_view what) {
  received->Reset();
  std::vector<OwnedFd> passed;
  for (size_t done = 0; done < size;) {
    absl::StatusOr<size_t> n = ReceiveSome(fd, data + done, size - done, &passed);
    if (!n.ok()) {
      return absl::Status(n.status().code(), absl::StrCat(what, ": ", n.status().message(), " after ", done, " of ",
                                                          size, " bytes"));
    }
    if (*n == 0) {
      SUMMA_RETURN_IF_ERROR(Await(fd, POLLIN, deadline, what));
      continue;
    }
    done += *n;
  }
  // One descriptor is all these messages carry; any more are closed as `passed` goes.
  if (!passed.empty()) *received = std::move(passed.front());
  return absl::OkStatus();
}

absl::StatusOr<size_t> ReceiveSome(int fd, char* data, size_t size, std::vector<OwnedFd>* received) {
  for (;;) {
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxPassedFds * sizeof(int))];
    iovec iov = {data, size};
    msghdr message = {};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return ErrnoStatus(errno, "receive");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < count; ++k) {
        int got;
        std::memcpy(&got, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        received->emplace_back(got);
      }
    }
    if (message.msg_flags & MSG_CTRUNC) {
      // The kernel dropped descriptors sent beside these bytes: this process holds as many as
      // its limit allows (RLIMIT_NOFILE), or more came than a message carries.
      return absl::ResourceExhaustedError("descriptors sent beside the bytes were dropped (the open-file limit?)");
    }
    if (n == 0 && size > 0) return absl::UnavailableError("the connection closed");
    return static_cast<size_t>(n);
  }
}

int PeerUid(int fd) {
  ucred credentials = {};
  socklen_t length = sizeof(credentials);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
  return static_cast<int>(credentials.uid);
}

void SetNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetUnsentLimit(int fd) {
  const int unsent = kMaxUnsentBytes;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &unsent, sizeof(unsent));
}

absl::StatusOr<OwnedFd> Listen(const std::string& address, int* port) {
  std::string host;
  int wanted = 0;
  if (absl::Status s = SplitAddress(address, &host, &wanted); !s.ok()) return s;
  absl::StatusOr<AddrInfo> found = Resolve(host, wanted, /*passive=*/true);
  if (!found.ok()) return found.status();
  // Every address (no host, "::", "[::]"): one IPv6 socket that takes IPv4 too, before the
  // resolver's list (which names 0.0.0.0 first, IPv4 alone).
  const bool every = host.empty() || host == "::";
  std::vector<addrinfo*> candidates;
  sockaddr_in6 any6 = {};
  addrinfo dual = {};
  if (every) {
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(static_cast<uint16_t>(wanted));
    dual.ai_family = AF_INET6;
    dual.ai_socktype = SOCK_STREAM;
    dual.ai_addr = reinterpret_cast<sockaddr*>(&any6);
    dual.ai_addrlen = sizeof(any6);
    candidates.push_back(&dual);
  }
  for (addrinfo* a = found->get(); a != nullptr; a = a->ai_next) candidates.push_back(a);
  int error = 0;
  for (addrinfo* a : candidates) {
    OwnedFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      error = errno;
      continue;
    }
    const int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a == &dual) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      error = errno;
      continue;
    }
    *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return fd;
  }
  return ErrnoStatus(error, absl::StrCat("cannot listen on ", address));
}

absl::StatusOr<OwnedFd> Connect(const std::string& host, int port, absl::Time deadline) {
  absl::StatusOr<AddrInfo> found = Resolve(host, port, /*passive=*/false);
  if (!found.ok()) return found.status();
  const std::string what = absl::StrCat("connect to the data plane at ", host, ":", port);
  absl::Status last = absl::UnavailableError(absl::StrCat(what, ": no address"));
  for (addrinfo* a = found->get(); a != nullptr; a = a->ai_next) {
    OwnedFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoStatus(errno, what);
      continue;
    }
    SetNoDelay(fd.get());
    SetUnsentLimit(fd.get());
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = ErrnoStatus(errno, what);
        continue;
      }
      if (absl::Status ready = Await(fd.get(), POLLOUT, deadline, what); !ready.ok()) {
        last = ready;
        continue;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last = ErrnoStatus(error, what);
        continue;
      }
    }
    return fd;
  }
  return last;
}

absl::StatusOr<std::string> HostOf(absl::string_view address) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitAddress(address, &host, &port); !s.ok()) return s;
  return host;
}

void Gather(const grpc::ByteBuffer& message, char* header, size_t header_bytes, std::vector<grpc::Slice>& slices,
            std::vector<iovec>& iov) {
  slices.clear();
  iov.clear();
  iov.push_back({header, header_bytes});
  if (message.Valid()) {
    (void)message.Dump(&slices);  // fails only for an invalid buffer
    for (const grpc::Slice& s : slices) {
      if (s.size() > 0) iov.push_back({const_cast<uint8_t*>(s.begin()), s.size()});
    }
  }
}

}  // namespace summa::socket_plane
