// The socket data plane's frames (common/rpc/socket_frame.h), written and read by hand, for the
// tests of the plane's server end: tests/socket_plane_test.cc (no gRPC server) and
// tests/ps_client_test.cc and tests/socket_calls_test.cc (the daemon's plane beside its gRPC
// server).
#ifndef SUMMA_TESTS_SOCKET_FRAMES_H_
#define SUMMA_TESTS_SOCKET_FRAMES_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/socket_frame.h"
#include "common/status_macros.h"
#include "common/tensor_proto.h"
#include "gtest/gtest.h"
#include "summa/v1/summa.pb.h"

namespace summa::test {

struct RawReply {
  socket_plane::ReplyHeader header;
  std::string message;
  std::string body;
};

inline socket_plane::OwnedFd RawConnect(int port) {
  absl::StatusOr<socket_plane::OwnedFd> fd = socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *std::move(fd) : socket_plane::OwnedFd();
}

inline void SendBytes(int fd, std::string bytes) {
  iovec iov = {bytes.data(), bytes.size()};
  ASSERT_TRUE(socket_plane::WriteFull(fd, &iov, 1, absl::Now() + absl::Seconds(10), "test bytes").ok());
}

inline void SendHello(int fd, const std::string& authorization) {
  char hello[socket_plane::kHelloBytes];
  socket_plane::EncodeHello(static_cast<uint32_t>(authorization.size()), hello);
  SendBytes(fd, std::string(hello, sizeof(hello)) + authorization);
}

// A request frame: `method`, `message`, and a header claiming `claimed` bytes (the message's by default).
inline void SendRequest(int fd, uint32_t method, const std::string& message, int64_t claimed = -1) {
  char head[socket_plane::kHeaderBytes];
  socket_plane::EncodeRequestHeader({method, claimed < 0 ? message.size() : static_cast<uint64_t>(claimed)}, head);
  SendBytes(fd, std::string(head, sizeof(head)) + message);
}

inline absl::StatusOr<RawReply> ReadReply(int fd) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  char head[socket_plane::kHeaderBytes];
  SUMMA_RETURN_IF_ERROR(socket_plane::ReadFull(fd, head, sizeof(head), deadline, "a reply header"));
  RawReply reply;
  reply.header = socket_plane::DecodeReplyHeader(head);
  reply.message.resize(reply.header.message_length);
  reply.body.resize(reply.header.length);
  SUMMA_RETURN_IF_ERROR(socket_plane::ReadFull(fd, reply.message.data(), reply.message.size(), deadline, "a message"));
  SUMMA_RETURN_IF_ERROR(socket_plane::ReadFull(fd, reply.body.data(), reply.body.size(), deadline, "a body"));
  return reply;
}

// True when the server closed `fd`: a read finds its end (or a reset, where bytes the server
// never read were left behind).
inline bool ClosedByServer(int fd) {
  char byte;
  const absl::Status s = socket_plane::ReadFull(fd, &byte, 1, absl::Now() + absl::Seconds(10), "the end");
  return absl::IsUnavailable(s);
}

// An AllReduce request of `values` from rank `rank` of a fixed group of `group`.
inline std::string AllReduceMessage(const std::string& name, int group, int rank, const std::vector<float>& values) {
  summa::v1::AllReduceRequest r;
  r.set_name(name);
  r.set_group_size(group);
  r.set_rank(rank);
  SpecToProto({"t", DType::kFloat32, {static_cast<int64_t>(values.size())}}, r.mutable_tensor());
  r.mutable_tensor()->set_data(values.data(), values.size() * sizeof(float));
  return r.SerializeAsString();
}

// Waits (up to 20 s) until `done` holds; whether it did. For a state that the code under test
// reaches on a thread of its own and tells no one of.
inline bool Eventually(const std::function<bool()>& done) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

inline constexpr uint32_t kAllReduceMethod = static_cast<uint32_t>(socket_plane::DataMethod::kAllReduce);

}  // namespace summa::test

#endif  // SUMMA_TESTS_SOCKET_FRAMES_H_
