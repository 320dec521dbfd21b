#include "bench/raw_allreduce.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/rpc/socket_frame.h"

namespace summa::bench {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  const int error = errno;
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == EAGAIN || error == EWOULDBLOCK) return absl::DeadlineExceededError(message);
  return absl::UnavailableError(message);
}

using socket_plane::OwnedFd;
using socket_plane::SetNoDelay;

// A rank's connection, as the server sees it during one round.
struct RankConnection {
  explicit RankConnection(int fd) : fd(fd), stage(kRawChunkBytes / 4 + 1) {}
  OwnedFd fd;
  int64_t received = 0;      // bytes of this round's tensor read
  int64_t sent = 0;          // bytes of this round's sum written
  int64_t added = 0;         // floats of this round's tensor added into the sum
  std::vector<float> stage;  // bytes read but not yet added: at most one chunk and a partial float
  size_t staged = 0;
  bool closed = false;       // the rank closed its connection before this round
};

// Milliseconds for poll: what is left until `deadline`, at least 0.
int PollTimeoutMs(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()) + 1));
}

absl::Status AcceptRanks(int listener, int group_size, absl::Time deadline,
                         std::vector<RankConnection>& ranks) {
  while (static_cast<int>(ranks.size()) < group_size) {
    pollfd p = {listener, POLLIN, 0};
    const int ready = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (ready < 0 && errno != EINTR) return ErrnoError("poll on the listening socket");
    if (ready == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("raw server: only ", ranks.size(), " of ",
                                                      group_size, " ranks connected in time"));
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return ErrnoError("accept");
    }
    SetNoDelay(fd);
    ranks.emplace_back(fd);
  }
  return absl::OkStatus();
}

// Reads what `rank` has sent of this round's tensor and adds every whole float into `sum`.
absl::Status ReadFrom(RankConnection& rank, int index, int64_t bytes, std::vector<float>& sum) {
  char* stage = reinterpret_cast<char*>(rank.stage.data());
  const int64_t want = std::min(kRawChunkBytes, bytes - rank.received);
  const ssize_t n = ::recv(rank.fd.get(), stage + rank.staged, want, 0);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return absl::OkStatus();
    return ErrnoError(absl::StrCat("raw server: receive from rank connection ", index));
  }
  if (n == 0) {
    if (rank.received == 0) {
      rank.closed = true;
      return absl::OkStatus();
    }
    return absl::UnavailableError(absl::StrCat("raw server: rank connection ", index, " closed after ",
                                               rank.received, " of ", bytes, " bytes"));
  }
  rank.received += n;
  rank.staged += n;
  const size_t whole = rank.staged / 4;
  float* out = sum.data() + rank.added;
  for (size_t i = 0; i < whole; ++i) out[i] += rank.stage[i];
  rank.added += whole;
  rank.staged -= whole * 4;
  std::memmove(stage, stage + whole * 4, rank.staged);
  return absl::OkStatus();
}

absl::Status WriteTo(RankConnection& rank, int index, int64_t bytes, const std::vector<float>& sum) {
  const char* data = reinterpret_cast<const char*>(sum.data());
  const int64_t want = std::min(kRawChunkBytes, bytes - rank.sent);
  const ssize_t n = ::send(rank.fd.get(), data + rank.sent, want, MSG_NOSIGNAL);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return absl::OkStatus();
    return ErrnoError(absl::StrCat("raw server: send to rank connection ", index));
  }
  rank.sent += n;
  return absl::OkStatus();
}

// One round: every tensor in and summed, then the sum out to every rank. Sets `finished` instead
// when every rank has closed its connection.
absl::Status ServeRound(std::vector<RankConnection>& ranks, int64_t bytes, absl::Time deadline,
                        std::vector<float>& sum, bool& finished) {
  std::fill(sum.begin(), sum.end(), 0.0f);
  for (RankConnection& r : ranks) r.received = r.sent = r.added = r.staged = 0;
  auto poll_until_done = [&](short events, auto pending, auto step) -> absl::Status {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<int> which;
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (pending(ranks[i])) {
          fds.push_back({ranks[i].fd.get(), events, 0});
          which.push_back(static_cast<int>(i));
        }
      }
      if (fds.empty()) return absl::OkStatus();
      const int ready = ::poll(fds.data(), fds.size(), PollTimeoutMs(deadline));
      if (ready < 0 && errno != EINTR) return ErrnoError("raw server: poll");
      if (ready == 0 && absl::Now() >= deadline) {
        return absl::DeadlineExceededError("raw server: a round did not complete in time");
      }
      for (size_t j = 0; j < fds.size(); ++j) {
        if (fds[j].revents != 0) {
          absl::Status s = step(ranks[which[j]], which[j]);
          if (!s.ok()) return s;
        }
      }
    }
  };
  absl::Status in = poll_until_done(
      POLLIN, [&](const RankConnection& r) { return !r.closed && r.received < bytes; },
      [&](RankConnection& r, int i) { return ReadFrom(r, i, bytes, sum); });
  if (!in.ok()) return in;
  const auto closed = std::count_if(ranks.begin(), ranks.end(), [](const RankConnection& r) { return r.closed; });
  if (closed == static_cast<long>(ranks.size())) {
    finished = true;
    return absl::OkStatus();
  }
  if (closed > 0) {
    return absl::UnavailableError(
        absl::StrCat("raw server: ", closed, " rank connection(s) closed while the others sent a round"));
  }
  return poll_until_done(
      POLLOUT, [&](const RankConnection& r) { return r.sent < bytes; },
      [&](RankConnection& r, int i) { return WriteTo(r, i, bytes, sum); });
}

absl::StatusOr<sockaddr_in> LoopbackAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535 || ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not an IPv4 host:port"));
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

}  // namespace

absl::Status RunRawServer(const RawServerOptions& options) {
  if (options.bytes <= 0 || options.bytes % 4 != 0) {
    return absl::InvalidArgumentError("raw server: the size must be a positive multiple of 4 bytes");
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  OwnedFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return ErrnoError("raw server: socket");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener.get(), options.group_size) != 0 ||
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return ErrnoError("raw server: listen on 127.0.0.1:0");
  }
  absl::Status written = WriteFileAtomically(options.port_file, absl::StrCat(ntohs(address.sin_port), "\n"));
  if (!written.ok()) return written;

  std::vector<RankConnection> ranks;
  ranks.reserve(options.group_size);
  absl::Status accepted = AcceptRanks(listener.get(), options.group_size, deadline, ranks);
  if (!accepted.ok()) return accepted;
  std::vector<float> sum(options.bytes / 4);
  for (bool finished = false; !finished;) {
    absl::Status round = ServeRound(ranks, options.bytes, deadline, sum, finished);
    if (!round.ok()) return round;
  }
  ranks.clear();
  // The driver reads this process's peak RSS now, then stops it.
  absl::SleepFor(options.timeout);
  return absl::DeadlineExceededError("raw server: nobody stopped it after its ranks finished");
}

absl::StatusOr<std::unique_ptr<RawAllReduceClient>> RawAllReduceClient::Connect(
    const std::string& address, absl::Duration timeout) {
  absl::StatusOr<sockaddr_in> to = LoopbackAddress(address);
  if (!to.ok()) return to.status();
  OwnedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoError("socket");
  const timeval limit = absl::ToTimeval(timeout);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  SetNoDelay(fd.get());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*to), sizeof(*to)) != 0) {
    return ErrnoError(absl::StrCat("connect to the raw server at ", address));
  }
  return std::unique_ptr<RawAllReduceClient>(new RawAllReduceClient(fd.release()));
}

RawAllReduceClient::~RawAllReduceClient() { ::close(fd_); }

absl::Status RawAllReduceClient::AllReduce(const std::vector<float>& in, std::vector<float>& out) {
  const int64_t bytes = static_cast<int64_t>(in.size()) * 4;
  out.resize(in.size());
  const char* data = reinterpret_cast<const char*>(in.data());
  for (int64_t sent = 0; sent < bytes;) {
    const ssize_t n = ::send(fd_, data + sent, std::min(kRawChunkBytes, bytes - sent), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("send to the raw server");
    sent += n;
  }
  char* sum = reinterpret_cast<char*>(out.data());
  for (int64_t received = 0; received < bytes;) {
    const ssize_t n = ::recv(fd_, sum + received, std::min(kRawChunkBytes, bytes - received), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("receive from the raw server");
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat("the raw server closed the connection after ",
                                                 received, " of ", bytes, " bytes of the sum"));
    }
    received += n;
  }
  return absl::OkStatus();
}

}  // namespace summa::bench
