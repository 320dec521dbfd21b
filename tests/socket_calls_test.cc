// The socket data plane of a daemon (tests/server_fixture.h), which its clients (client/
// socket_calls.h) find through its gRPC server: choosing it, cancelling and ending its calls,
// refusing malformed replies, listening on every address. The plane's tests that need no gRPC
// server are in socket_plane_test.cc, which the TSan pass runs.
#include "client/socket_calls.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/socket_frame.h"
#include "common/status_reason.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/server_fixture.h"
#include "tests/socket_frames.h"

namespace summa {
namespace {

using test::AllReduceMessage;
using test::Eventually;
using test::kAllReduceMethod;
using test::RawConnect;
using test::ReadReply;
using test::SendBytes;
using test::SendHello;
using test::SendRequest;

class SocketPlaneTest : public ServerFixture {
 protected:
  SocketPlaneTest() { plane_ = worker::DataPlane::kSocket; }

  absl::Status AllReduceAlone(worker::ParameterClient& client) {
    worker::Collective group;
    group.name = "alone";
    group.group_size = 1;
    std::vector<float> values = {1, 2, 3};
    return client.AllReduceInto(group, values, absl::MakeSpan(values));
  }
};

TEST_F(SocketPlaneTest, RequiredWhereTheServerServesNoneItIsAnErrorAndAutoTakesGrpc) {
  data_address_ = "";
  StartServer(1, 4 << 20);
  EXPECT_EQ(server_->data_port(), 0);
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  const absl::Status refused = AllReduceAlone(*client);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--data_address")) << refused;
  plane_ = worker::DataPlane::kAuto;
  client = Client(1);
  ASSERT_TRUE(AllReduceAlone(*client).ok());
  EXPECT_FALSE(client->on_socket_plane());
  EXPECT_EQ(Status().allreduce_rounds(), 1u);
}

TEST_F(SocketPlaneTest, AutoTakesThePlaneWhereServed) {
  StartServer(1, 4 << 20);
  ASSERT_NE(server_->data_port(), 0);
  plane_ = worker::DataPlane::kAuto;
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  ASSERT_TRUE(AllReduceAlone(*client).ok());
  EXPECT_TRUE(client->on_socket_plane());
}

// The round's own deadline is far off in these two: only the cancellation can let go of the call.
constexpr absl::Duration kFarBarrierDeadline = absl::Minutes(5);

TEST_F(SocketPlaneTest, AClientThatClosesItsConnectionCancelsItsWaitingCall) {
  configure_ = [](server::ServerOptions& o) { o.barrier_deadline = kFarBarrierDeadline; };
  StartServer(1, 4 << 20);
  socket_plane::OwnedFd fd = RawConnect(server_->data_port());
  SendHello(fd.get(), "");
  ASSERT_TRUE(ReadReply(fd.get()).ok());
  SendRequest(fd.get(), kAllReduceMethod, AllReduceMessage("pair", 2, 0, {1, 2}));
  ASSERT_TRUE(Eventually([&] { return Status().parked_calls() == 1; }));
  fd.Reset();
  EXPECT_TRUE(Eventually([&] { return Status().parked_calls() == 0; })) << Status().parked_calls();
}

TEST_F(SocketPlaneTest, ACallPastItsDeadlineEndsAtTheClientAndIsCancelledAtTheServer) {
  configure_ = [](server::ServerOptions& o) { o.barrier_deadline = kFarBarrierDeadline; };
  StartServer(1, 4 << 20);
  std::unique_ptr<worker::ParameterClient> client = Client(1, /*deadline=*/absl::Milliseconds(300));
  worker::Collective group;
  group.name = "pair";
  group.group_size = 2;
  std::vector<float> values = {1, 2, 3};
  const absl::Status s = client->AllReduceInto(group, values, absl::MakeSpan(values));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(Eventually([&] { return Status().parked_calls() == 0; })) << Status().parked_calls();
}

TEST_F(SocketPlaneTest, ShutdownAnswersAWaitingCallAndClosesThePlane) {
  StartServer(1, 4 << 20);
  const int port = server_->data_port();
  absl::Status result;
  std::thread waiting([&] {
    std::unique_ptr<worker::ParameterClient> client = Client(1);
    worker::Collective group;
    group.name = "pair";
    group.group_size = 2;
    std::vector<float> values = {1, 2, 3};
    result = client->AllReduceInto(group, values, absl::MakeSpan(values));
  });
  ASSERT_TRUE(Eventually([&] { return Status().parked_calls() == 1; }));
  server_->Shutdown();
  waiting.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_TRUE(absl::StrContains(result.message(), "shutting down")) << result;
  EXPECT_FALSE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(5)).ok());
}

// A fake plane (a listener of the test's own) answers the hello, then a call with `reply`.
absl::Status CallAFakePlane(const std::string& reply) {
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("127.0.0.1:0", &port);
  if (!listener.ok()) return listener.status();
  std::thread fake([&] {
    const int fd = ::accept(listener->get(), nullptr, nullptr);
    if (fd < 0) return;
    socket_plane::OwnedFd conn(fd);
    char hello[socket_plane::kHelloBytes];
    if (!socket_plane::ReadFull(fd, hello, sizeof(hello), absl::Now() + absl::Seconds(10), "hello").ok()) return;
    char ok[socket_plane::kHeaderBytes];
    socket_plane::EncodeReplyHeader({0, 0, 0}, ok);
    SendBytes(fd, std::string(ok, sizeof(ok)));
    char head[socket_plane::kHeaderBytes];
    if (!socket_plane::ReadFull(fd, head, sizeof(head), absl::Now() + absl::Seconds(10), "request").ok()) return;
    std::string body(socket_plane::DecodeRequestHeader(head).length, '\0');
    if (!socket_plane::ReadFull(fd, body.data(), body.size(), absl::Now() + absl::Seconds(10), "body").ok()) return;
    SendBytes(fd, reply);
    char byte;  // until the client closes
    socket_plane::ReadFull(fd, &byte, 1, absl::Now() + absl::Seconds(10), "end").IgnoreError();
  });
  auto calls = std::make_unique<worker::SocketCalls>(std::vector<worker::SocketCalls::Endpoint>{{"127.0.0.1", port}}, "");
  absl::Status result = calls->Open(0, absl::Now() + absl::Seconds(10));
  if (result.ok()) {
    grpc::Slice slice(std::string("request"));
    grpc::ByteBuffer request(&slice, 1), response;
    calls->Start(0, 0, socket_plane::DataMethod::kPull, &request, &response, absl::Now() + absl::Seconds(10));
    size_t tag = 99;
    if (!calls->Next(&tag, &result) || tag != 0) result = absl::InternalError("no call came back");
  }
  calls.reset();  // closes the connection: the fake ends
  fake.join();
  return result;
}

TEST(SocketCallsTest, MalformedRepliesEndTheCallAsDataLoss) {
  char head[socket_plane::kHeaderBytes];
  // An error whose body (its details) is past the limit.
  socket_plane::EncodeReplyHeader(
      {static_cast<uint32_t>(absl::StatusCode::kInternal), 0, socket_plane::kMaxStatusMessageBytes + 1}, head);
  absl::Status s = CallAFakePlane(std::string(head, sizeof(head)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A status message past the limit.
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kInternal),
                                   socket_plane::kMaxStatusMessageBytes + 1, 0}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A well-formed refusal comes through as it is.
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kOutOfRange), 4, 0}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)) + "late");
  EXPECT_EQ(s, absl::OutOfRangeError("late"));
  // ... and one with details keeps its reason, whatever its message says.
  const std::string details = StatusDetails(WithReason(absl::AbortedError("x"), StatusReason::kStaleView));
  socket_plane::EncodeReplyHeader({static_cast<uint32_t>(absl::StatusCode::kAborted), 4,
                                   static_cast<uint64_t>(details.size())}, head);
  s = CallAFakePlane(std::string(head, sizeof(head)) + "late" + details);
  EXPECT_EQ(s.message(), "late");
  EXPECT_TRUE(IsStaleView(s)) << s;
}

// A fake plane that closes each of its first `closes` connections once it has read the hello,
// as a flooded plane evicts one, and answers the next with `answer` (a reply header's code).
// Open's result, and the connections the fake took.
struct OpenedAfterCloses {
  absl::Status status;
  int connections = 0;
};
OpenedAfterCloses OpenAFakePlaneThatCloses(int closes, absl::StatusCode answer = absl::StatusCode::kOk) {
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("127.0.0.1:0", &port);
  if (!listener.ok()) return {listener.status(), 0};
  OpenedAfterCloses result;
  std::thread fake([&] {
    for (;;) {
      const int fd = ::accept(listener->get(), nullptr, nullptr);
      if (fd < 0) return;  // the test is done with it
      socket_plane::OwnedFd conn(fd);
      const int k = result.connections++;
      char hello[socket_plane::kHelloBytes];
      if (!socket_plane::ReadFull(fd, hello, sizeof(hello), absl::Now() + absl::Seconds(10), "hello").ok()) return;
      if (k < closes) continue;  // closed with no answer
      char head[socket_plane::kHeaderBytes];
      socket_plane::EncodeReplyHeader({static_cast<uint32_t>(answer), 0, 0}, head);
      SendBytes(fd, std::string(head, sizeof(head)));
      char byte;  // until the client closes
      socket_plane::ReadFull(fd, &byte, 1, absl::Now() + absl::Seconds(10), "end").IgnoreError();
    }
  });
  {
    worker::SocketCalls calls({{"127.0.0.1", port}}, "");
    result.status = calls.Open(0, absl::Now() + absl::Seconds(10));
  }
  ::shutdown(listener->get(), SHUT_RDWR);  // the fake's accept returns
  fake.join();
  return result;
}

TEST(SocketCallsTest, AConnectionClosedBeforeItsHelloIsAnsweredIsOpenedAgainAFewTimes) {
  // Closed twice (evicted by a flooded plane, say), answered the third time: open.
  OpenedAfterCloses opened = OpenAFakePlaneThatCloses(2);
  EXPECT_TRUE(opened.status.ok()) << opened.status;
  EXPECT_EQ(opened.connections, 3);
  // Closed every time: UNAVAILABLE after kHelloAttempts connections.
  opened = OpenAFakePlaneThatCloses(1000);
  EXPECT_EQ(opened.status.code(), absl::StatusCode::kUnavailable) << opened.status;
  EXPECT_EQ(opened.connections, worker::SocketCalls::kHelloAttempts);
  // An answer is final: a refused hello is not tried again.
  opened = OpenAFakePlaneThatCloses(0, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(opened.status.code(), absl::StatusCode::kUnauthenticated) << opened.status;
  EXPECT_EQ(opened.connections, 1);
}

// Whether `fd` has bytes to read within `wait`.
bool Readable(int fd, absl::Duration wait) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) > 0 && (p.revents & POLLIN);
}

TEST(SocketCallsTest, AShardsRequestsGoOutOneAfterAnotherInTheOrderTheCallsStarted) {
  // Three calls to one shard, each request far larger than what the fake's small receive buffer
  // and the client's unsent bytes (kMaxUnsentBytes) hold: while the fake reads none of the first,
  // the second and third send nothing; then the second goes, and only after it the third.
  constexpr int kCalls = 3;
  constexpr size_t kRequestBytes = 4 << 20;
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("127.0.0.1:0", &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int small = 64 << 10;  // the accepted connections' receive buffers (inherited)
  ASSERT_EQ(::setsockopt(listener->get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  std::vector<std::string> order;  // what the fake saw, in the order it saw it
  std::thread fake([&] {
    std::vector<socket_plane::OwnedFd> conns;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (int k = 0; k < kCalls; ++k) {
      const int fd = ::accept(listener->get(), nullptr, nullptr);
      if (fd < 0) return;
      conns.emplace_back(fd);
      char hello[socket_plane::kHelloBytes];
      if (!socket_plane::ReadFull(fd, hello, sizeof(hello), deadline, "hello").ok()) return;
      char ok[socket_plane::kHeaderBytes];
      socket_plane::EncodeReplyHeader({0, 0, 0}, ok);
      SendBytes(fd, std::string(ok, sizeof(ok)));
    }
    std::string body(kRequestBytes + 64, '\0');
    for (int k = 0; k < kCalls; ++k) {
      // The calls after this one have sent nothing yet.
      for (int later = k + 1; later < kCalls; ++later) {
        if (Readable(conns[later].get(), absl::Milliseconds(later == k + 1 ? 200 : 0))) {
          order.push_back(absl::StrCat("call ", later, " sent before call ", k));
        }
      }
      const int fd = conns[k].get();
      char head[socket_plane::kHeaderBytes];
      if (!socket_plane::ReadFull(fd, head, sizeof(head), deadline, "request").ok()) return;
      const socket_plane::RequestHeader request = socket_plane::DecodeRequestHeader(head);
      if (request.length + request.lead > body.size() ||
          !socket_plane::ReadFull(fd, body.data(), request.lead + request.length, deadline, "body").ok()) {
        return;
      }
      order.push_back(absl::StrCat("call ", k, ": ", request.length, " bytes"));
    }
    for (int k = 0; k < kCalls; ++k) {
      char ok[socket_plane::kHeaderBytes];
      socket_plane::EncodeReplyHeader({0, 0, 0}, ok);
      SendBytes(conns[k].get(), std::string(ok, sizeof(ok)));
    }
    for (int k = 0; k < kCalls; ++k) {
      char byte;  // until the client closes
      socket_plane::ReadFull(conns[k].get(), &byte, 1, deadline, "end").IgnoreError();
    }
  });
  {
    worker::SocketCalls calls({{"127.0.0.1", port}}, "");
    ASSERT_TRUE(calls.Open(0, absl::Now() + absl::Seconds(10)).ok());
    std::vector<grpc::ByteBuffer> requests, replies(kCalls);
    for (int k = 0; k < kCalls; ++k) {
      grpc::Slice slice(std::string(kRequestBytes, static_cast<char>('a' + k)));
      requests.emplace_back(&slice, 1);
    }
    for (int k = 0; k < kCalls; ++k) {
      calls.Start(k, 0, socket_plane::DataMethod::kPush, &requests[k], &replies[k], absl::Now() + absl::Seconds(30));
    }
    for (int k = 0; k < kCalls; ++k) {
      size_t tag = 99;
      absl::Status status;
      ASSERT_TRUE(calls.Next(&tag, &status));
      EXPECT_TRUE(status.ok()) << tag << ": " << status;
    }
  }  // closes the connections: the fake ends
  fake.join();
  const std::string want = absl::StrCat("call 0: ", kRequestBytes, " bytes|call 1: ", kRequestBytes,
                                        " bytes|call 2: ", kRequestBytes, " bytes");
  EXPECT_EQ(absl::StrJoin(order, "|"), want);
}

TEST(SocketFrameTest, AListenerOnEveryAddressTakesIpv4AndIpv6) {
  int port = 0;
  absl::StatusOr<socket_plane::OwnedFd> listener = socket_plane::Listen("[::]:0", &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_NE(port, 0);
  EXPECT_TRUE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(10)).ok());
  absl::StatusOr<socket_plane::OwnedFd> bare = socket_plane::Listen(":0", &port);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(socket_plane::Connect("127.0.0.1", port, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(socket_plane::Listen("no-port", &port).status().code(), absl::StatusCode::kInvalidArgument);
  // And IPv6, where this machine has an IPv6 loopback (the resolver's wildcard list puts
  // 0.0.0.0, IPv4 alone, first).
  socket_plane::OwnedFd probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 loopback = {};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  if (probe.valid() && ::bind(probe.get(), reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0) {
    absl::StatusOr<socket_plane::OwnedFd> v6 = socket_plane::Connect("::1", port, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(v6.ok()) << v6.status();
  }
}

}  // namespace
}  // namespace summa
