// The socket data plane's server end (server/rpc/socket_plane.h) over the service's data-path
// handlers and the core, with no gRPC server and no gRPC client: raw frames written by hand
// (tests/socket_frames.h) and the client's own SocketCalls, on 127.0.0.1 and ports the OS picks.
// Nothing here starts gRPC's threads, so this test is labelled `unit`, not `unit-grpc`, and the
// TSan pass runs it (tests/CMakeLists.txt). The plane's tests that need the daemon's gRPC server
// (a worker::ParameterClient finds the plane through the DataPlane RPC) are in socket_calls_test.cc
// and ps_client_test.cc.
#include "server/rpc/socket_plane.h"
#include "common/rpc/grpc_status.h"
#include "common/status_reason.h"
#include "tests/parameter_server_peer.h"

#include <fcntl.h>
#include <poll.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "client/socket_calls.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/wire.h"
#include "common/shared_segment.h"
#include "common/trace.h"
#include "gtest/gtest.h"
#include "server/core/all_reduce.h"
#include "server/core/parameter_server.h"
#include "server/core/snapshot.h"
#include "server/rpc/service.h"
#include "summa/v1/summa.pb.h"
#include "tests/socket_frames.h"

namespace summa::server {
namespace {

namespace pb = ::summa::v1;
using test::AllReduceMessage;
using test::ClosedByServer;
using test::Eventually;
using test::kAllReduceMethod;
using test::RawConnect;
using test::RawReply;
using test::ReadReply;
using test::SendBytes;
using test::SendHello;
using test::SendRequest;

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// A plane on 127.0.0.1:0 over a core of `world_size` members (lr 0.5, one partition of 4
// floats once a member joins) and an AllReduce hub, as the daemon wires them, without gRPC.
class SocketPlaneFixture : public ::testing::Test {
 protected:
  void StartPlane(SocketPlaneOptions options = {}, TokenCheck tokens = {}, int world_size = 1) {
    // A log line's time loads the local time zone, once, in Abseil's cctz, which TSan does not
    // see publish the mutex it makes then (the library is not instrumented): loaded here, before
    // the plane's threads start, rather than by the first two of them to log (the TSan pass runs
    // this test with io_sync=0, where no socket traffic orders them: tests/CMakeLists.txt).
    absl::LocalTimeZone();
    ServerOptions o;
    o.world_size = world_size;
    o.optimizer.learning_rate = 0.5;
    o.barrier_deadline = absl::Seconds(20);
    if (configure_) configure_(o);
    core_ = std::make_unique<ParameterServer>(o);
    hub_ = std::make_unique<AllReduceHub>(o.barrier_deadline, o.clock, &core_->membership(), o.limits);
    tokens_ = std::move(tokens);
    // The daemon's thread for blocking tasks: none of the data path's calls hands one over.
    service_ = std::make_unique<ParameterServerService>(
        core_.get(), hub_.get(), [](std::function<void()> task) { task(); }, &tokens_);
    absl::StatusOr<std::unique_ptr<SocketPlane>> plane = SocketPlane::Start("127.0.0.1:0", service_.get(), &tokens_, options);
    ASSERT_TRUE(plane.ok()) << plane.status();
    plane_ = *std::move(plane);
  }

  // The daemon's order: every waiting call answered, then the plane stopped.
  void TearDown() override {
    if (core_) core_->Shutdown();
    if (hub_) hub_->Shutdown();
    if (plane_) plane_->Stop();
  }

  // `values` summed over a fixed group of one, through the client's SocketCalls: its own values.
  absl::StatusOr<std::vector<float>> AllReduceAlone(const std::string& authorization,
                                                    const std::vector<float>& values) {
    worker::SocketCalls calls({{"127.0.0.1", plane_->port()}}, authorization);
    grpc::Slice slice(AllReduceMessage("alone", 1, 0, values));
    grpc::ByteBuffer request(&slice, 1), reply;
    calls.Start(0, 0, socket_plane::DataMethod::kAllReduce, &request, &reply, absl::Now() + absl::Seconds(10));
    size_t tag = 99;
    absl::Status status;
    if (!calls.Next(&tag, &status) || tag != 0) return absl::InternalError("no call came back");
    if (!status.ok()) return status;
    pb::AllReduceResponse response;
    if (!response.ParseFromString(Flatten(reply))) return absl::DataLossError("a reply that does not parse");
    const std::string& data = response.tensor().data();
    std::vector<float> sum(data.size() / sizeof(float));
    std::memcpy(sum.data(), data.data(), sum.size() * sizeof(float));
    return sum;
  }

  // Ranks 0 and 1 join the core, rank 0 with `initial` (the tensor "w"); their sessions.
  void JoinTwo(const std::vector<float>& initial, uint64_t sessions[2]) {
    const std::string initial_bytes(reinterpret_cast<const char*>(initial.data()), initial.size() * sizeof(float));
    for (int rank : {0, 1}) {
      JoinRequestView join;
      join.rank = rank;
      join.world_size = 2;
      join.params = {{{"w", DType::kFloat32, {static_cast<int64_t>(initial.size())}},
                      rank == 0 ? absl::string_view(initial_bytes) : absl::string_view()}};
      absl::StatusOr<JoinResult> joined = core_->Join(join);
      ASSERT_TRUE(joined.ok()) << joined.status();
      sessions[rank] = joined->session;
    }
  }

  // Two workers in threads take kSteps sync steps of PushPull of a model of `floats` through
  // SocketCalls to `endpoint`, each checking every step's weights; the core ends on the weights
  // they imply.
  // With `values_segment`, each worker's gradient lies in a values segment of its own
  // (SocketCalls::ShareValues) and its pushes carry it as a slice of their own, as
  // ParameterClient's do.
  static constexpr uint64_t kSteps = 20;
  void TwoWorkersStepExactly(const worker::SocketCalls::Endpoint& endpoint, size_t floats = 4,
                             bool values_segment = false);

  // A connection that has passed its hello.
  socket_plane::OwnedFd Greeted() {
    socket_plane::OwnedFd fd = RawConnect(plane_->port());
    SendHello(fd.get(), "");
    absl::StatusOr<RawReply> hello = ReadReply(fd.get());
    EXPECT_TRUE(hello.ok()) << hello.status();
    if (hello.ok()) {
      EXPECT_EQ(hello->header.code, 0u) << hello->message;
    }
    return fd;
  }

  // Expects a connection opened now to be refused as it is accepted, with RESOURCE_EXHAUSTED
  // saying `says`, and closed.
  void ExpectRefused(const std::string& says) {
    socket_plane::OwnedFd fd = RawConnect(plane_->port());
    absl::StatusOr<RawReply> reply = ReadReply(fd.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted)) << reply->message;
    EXPECT_EQ(reply->message, says);
    EXPECT_TRUE(ClosedByServer(fd.get()));
  }

  std::function<void(ServerOptions&)> configure_;  // the core's options, changed before it starts
  std::unique_ptr<ParameterServer> core_;
  std::unique_ptr<AllReduceHub> hub_;
  TokenCheck tokens_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<SocketPlane> plane_;
};

// Bytes of `fd`'s that the server's kernel has acknowledged (received, whether read or not).
uint64_t BytesAcked(int fd) {
  tcp_info info = {};
  socklen_t length = sizeof(info);
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length), 0) << std::strerror(errno);
  return info.tcpi_bytes_acked;
}

// True when the connection still serves: its hello (sent whole now, or the rest of it after
// `sent` bytes) is answered OK.
bool Greets(int fd, size_t sent = 0) {
  char hello[socket_plane::kHelloBytes];
  socket_plane::EncodeHello(0, hello);
  iovec rest = {hello + sent, sizeof(hello) - sent};
  if (!socket_plane::WriteFull(fd, &rest, 1, absl::Now() + absl::Seconds(10), "the hello").ok()) return false;
  absl::StatusOr<RawReply> answer = ReadReply(fd);
  return answer.ok() && answer->header.code == 0;
}

// The limits on connections (SocketPlaneOptions), set small. The silent connections here would
// be closed at the hello timeout: it is set far past each test's end, but where a test says.
class SocketPlaneLimitsTest : public SocketPlaneFixture {
 protected:
  // Bounds of `total` and `per_source` connections in their hello, all from 127.0.0.1: three
  // connections fill them, the oldest having sent half its hello and the other two nothing. A
  // fourth evicts the oldest of those that sent nothing, and the three left (the newcomer too)
  // all pass their hello.
  void ExpectTheOldestSilentConnectionEvicted(int64_t total, int64_t per_source) {
    SocketPlaneOptions options;
    options.max_connections_in_hello = total;
    options.max_connections_in_hello_per_source = per_source;
    options.hello_timeout = absl::Minutes(5);
    StartPlane(options);
    std::vector<socket_plane::OwnedFd> fds;
    for (int i = 0; i < 3; ++i) fds.push_back(RawConnect(plane_->port()));
    char hello[socket_plane::kHelloBytes];
    socket_plane::EncodeHello(0, hello);
    constexpr size_t kHalf = sizeof(hello) / 2;
    SendBytes(fds[0].get(), std::string(hello, kHalf));
    // The server has those bytes before the newcomer comes (the acceptor takes connections in
    // the order they were made, and asks the kernel what each has received).
    ASSERT_TRUE(Eventually([&] { return BytesAcked(fds[0].get()) >= kHalf; }));
    fds.push_back(RawConnect(plane_->port()));
    EXPECT_TRUE(ClosedByServer(fds[1].get())) << "the oldest silent connection was not closed";
    ASSERT_TRUE(Eventually([&] { return plane_->hello_evictions() == 1; })) << plane_->hello_evictions();
    EXPECT_TRUE(Greets(fds[0].get(), kHalf)) << "the oldest, which had spoken, was evicted";
    EXPECT_TRUE(Greets(fds[2].get())) << "a younger silent connection was evicted";
    EXPECT_TRUE(Greets(fds[3].get())) << "the newcomer was not served";
    EXPECT_EQ(plane_->hello_evictions(), 1u);
    // Counted as each connection's thread moves on from its answer.
    EXPECT_TRUE(Eventually([&] { return plane_->hellos_passed() == 3; })) << plane_->hellos_passed();
  }
};

TEST_F(SocketPlaneLimitsTest, PastThePerSourceBoundTheOldestSilentConnectionIsEvictedNotTheNewcomer) {
  ExpectTheOldestSilentConnectionEvicted(/*total=*/10, /*per_source=*/3);
}

TEST_F(SocketPlaneLimitsTest, PastTheTotalTheOldestSilentConnectionIsEvictedNotTheNewcomer) {
  ExpectTheOldestSilentConnectionEvicted(/*total=*/3, /*per_source=*/10);
}

TEST_F(SocketPlaneLimitsTest, AConnectionPastItsHelloIsNeverEvicted) {
  SocketPlaneOptions options;
  options.max_connections_in_hello = 2;
  options.max_connections_in_hello_per_source = 2;
  options.hello_timeout = absl::Minutes(5);
  StartPlane(options);
  std::vector<socket_plane::OwnedFd> greeted;
  for (int i = 0; i < 2; ++i) greeted.push_back(Greeted());
  // Ten silent connections, two more than the bounds hold: the eight oldest are evicted, one for
  // each newcomer past the second, and never a greeted one.
  std::vector<socket_plane::OwnedFd> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(RawConnect(plane_->port()));
  ASSERT_TRUE(Eventually([&] { return plane_->hello_evictions() == 8; })) << plane_->hello_evictions();
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(ClosedByServer(silent[i].get())) << i;
  for (int i = 8; i < 10; ++i) EXPECT_TRUE(Greets(silent[i].get())) << i;
  // The greeted ones still serve calls.
  for (const socket_plane::OwnedFd& fd : greeted) {
    SendRequest(fd.get(), kAllReduceMethod, AllReduceMessage("alone", 1, 0, {2.5f}));
    absl::StatusOr<RawReply> reply = ReadReply(fd.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.code, 0u) << reply->message;
  }
  EXPECT_EQ(plane_->hello_evictions(), 8u);
  // The evicted ones' threads end once they see their close.
  EXPECT_TRUE(Eventually([&] { return plane_->connections() == 4; })) << plane_->connections();
}

TEST_F(SocketPlaneLimitsTest, ASilentConnectionIsClosedAtTheHelloTimeout) {
  SocketPlaneOptions options;
  options.hello_timeout = absl::Milliseconds(200);
  StartPlane(options);
  const absl::Time connected = absl::Now();
  socket_plane::OwnedFd fd = RawConnect(plane_->port());
  EXPECT_TRUE(ClosedByServer(fd.get()));
  // Never before its time (the server counts from its accept, after the connect).
  EXPECT_GE(absl::Now() - connected, options.hello_timeout);
  ASSERT_TRUE(Eventually([&] { return plane_->hellos_failed() == 1; })) << plane_->hellos_failed();
  EXPECT_EQ(plane_->hello_evictions(), 0u);
  EXPECT_EQ(plane_->hellos_passed(), 0u);
}

TEST_F(SocketPlaneLimitsTest, AConnectionPastTheTotalIsRefusedWhetherTheOthersAreIdleOrInTheirHello) {
  SocketPlaneOptions options;
  options.max_connections_in_hello = 2;
  options.max_connections = 4;
  options.hello_timeout = absl::Minutes(5);  // one waits in its hello through a refusal
  StartPlane(options);
  std::vector<socket_plane::OwnedFd> open;
  for (int i = 0; i < 3; ++i) open.push_back(Greeted());  // idle between calls
  open.push_back(RawConnect(plane_->port()));             // in its hello
  ExpectRefused("the data plane holds 4 connections (summa-server --max_data_plane_connections)");
  // The one in its hello says it: four idle connections, the fifth still refused.
  SendHello(open[3].get(), "");
  absl::StatusOr<RawReply> hello = ReadReply(open[3].get());
  ASSERT_TRUE(hello.ok()) << hello.status();
  ASSERT_EQ(hello->header.code, 0u) << hello->message;
  ExpectRefused("the data plane holds 4 connections (summa-server --max_data_plane_connections)");
  EXPECT_EQ(plane_->connections(), 4);
  // One closes: there is room for one more, and only one.
  open[0].Reset();
  ASSERT_TRUE(Eventually([&] { return plane_->connections() == 3; })) << plane_->connections();
  open[0] = Greeted();
  ExpectRefused("the data plane holds 4 connections (summa-server --max_data_plane_connections)");
  // Once the client closes them all, a real client is served again.
  open.clear();
  ASSERT_TRUE(Eventually([&] { return plane_->connections() == 0; })) << plane_->connections();
  absl::StatusOr<std::vector<float>> sum = AllReduceAlone("", {4, 5});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, (std::vector<float>{4, 5}));
}

class SocketPlaneTest : public SocketPlaneFixture {};

TEST_F(SocketPlaneTest, TheHelloChecksTheTokenAndRefusesOtherProtocols) {
  StartPlane({}, TokenCheck("worker-secret", "", false));
  struct Case {
    std::string hello;  // sent as it is
    absl::StatusCode code;
    const char* says;
  };
  char fixed[socket_plane::kHelloBytes];
  auto hello = [&](const std::string& authorization) {
    socket_plane::EncodeHello(static_cast<uint32_t>(authorization.size()), fixed);
    return std::string(fixed, sizeof(fixed)) + authorization;
  };
  const std::vector<Case> cases = {
      {hello(""), absl::StatusCode::kUnauthenticated, "needs a bearer token"},
      {hello("Bearer wrong"), absl::StatusCode::kUnauthenticated, "matches none"},
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", absl::StatusCode::kInvalidArgument, "not a Summa data-plane hello"},
      {hello("Bearer worker-secret"), absl::StatusCode::kOk, ""},
  };
  for (const Case& c : cases) {
    socket_plane::OwnedFd fd = RawConnect(plane_->port());
    SendBytes(fd.get(), c.hello);
    absl::StatusOr<RawReply> reply = ReadReply(fd.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.code, static_cast<uint32_t>(c.code)) << c.hello << ": " << reply->message;
    EXPECT_TRUE(absl::StrContains(reply->message, c.says)) << reply->message;
    if (c.code != absl::StatusCode::kOk) {
      EXPECT_TRUE(ClosedByServer(fd.get())) << c.hello;
    }
  }
  EXPECT_EQ(AllReduceAlone("", {1}).status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::vector<float>> sum = AllReduceAlone("Bearer worker-secret", {1, 2, 3});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, (std::vector<float>{1, 2, 3}));
}

TEST_F(SocketPlaneTest, BadFramesAreRefusedAndTheirConnectionClosed) {
  SocketPlaneOptions options;
  options.max_message_bytes = 8 << 20;
  StartPlane(options);
  struct Case {
    uint32_t method;
    int64_t claimed;
    absl::StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {9, 0, absl::StatusCode::kInvalidArgument, "no data-path method numbered 9"},
      {0, 0, absl::StatusCode::kInvalidArgument, "no data-path method numbered 0"},
      {kAllReduceMethod, (8 << 20) + 1, absl::StatusCode::kResourceExhausted, "--max_message_bytes"},
  };
  for (const Case& c : cases) {
    socket_plane::OwnedFd fd = Greeted();
    SendRequest(fd.get(), c.method, "", c.claimed);
    absl::StatusOr<RawReply> reply = ReadReply(fd.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.code, static_cast<uint32_t>(c.code)) << reply->message;
    EXPECT_TRUE(absl::StrContains(reply->message, c.says)) << reply->message;
    EXPECT_TRUE(ClosedByServer(fd.get()));
  }
}

TEST_F(SocketPlaneTest, ValuesAtAnyOffsetInTheRequestAreReadAsFloats) {
  StartPlane();
  socket_plane::OwnedFd fd = Greeted();
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e-3f, -7.0f};
  // Names of 1 to 4 bytes put the values at every offset modulo 4, sent with no lead (padding):
  // the server moves them onto a boundary before the core reads them as floats (UBSan's
  // alignment check watches this in the sanitizer pass).
  for (int length = 1; length <= 4; ++length) {
    const std::string message = AllReduceMessage(std::string(length, 'n'), 1, 0, values);
    SendRequest(fd.get(), kAllReduceMethod, message);
    absl::StatusOr<RawReply> reply = ReadReply(fd.get());
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->header.code, 0u) << reply->message;
    pb::AllReduceResponse response;
    ASSERT_TRUE(response.ParseFromString(reply->body));
    EXPECT_EQ(response.tensor().data(), std::string(reinterpret_cast<const char*>(values.data()), 20))
        << "name of " << length;
  }
}

// Two members in threads, each with its own SocketCalls, push-pull step after step: the reply
// of the first to push is answered from the other's connection thread as its push completes the
// step, with the partition's snapshot lent to the reply. Every step's sum is applied once and
// every reply carries its step's weights. The plane's concurrency that the TSan pass checks.
// A refusal's reason travels in its body only to a client whose hello asked for it
// (kHelloRefusalDetails): an older client, which sends 0 there, takes a refusal with a body for a
// malformed reply.
TEST_F(SocketPlaneTest, ARefusalCarriesItsReasonOnlyToAClientWhoseHelloAsksForIt) {
  StartPlane({}, {}, /*world_size=*/2);
  uint64_t sessions[2];
  ASSERT_NO_FATAL_FAILURE(JoinTwo(std::vector<float>(4, 0.0f), sessions));
  ASSERT_TRUE(core_->Leave(1, sessions[1]).ok());  // the view moves on: rank 0's view 0 is stale
  pb::PushRequest push;
  push.set_rank(0);
  push.set_session(sessions[0]);
  push.set_view(0);
  push.set_num_examples(1);
  push.set_dtype(pb::DTYPE_FLOAT32);
  push.set_data(std::string(16, '\0'));
  for (uint32_t flags : {socket_plane::kHelloRefusalDetails, 0u}) {
    SCOPED_TRACE(flags);
    socket_plane::OwnedFd fd = RawConnect(plane_->port());
    char hello[socket_plane::kHelloBytes];
    socket_plane::EncodeHello(0, hello, flags);
    SendBytes(fd.get(), std::string(hello, sizeof(hello)));
    absl::StatusOr<RawReply> answer = ReadReply(fd.get());
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(answer->header.code, 0u) << answer->message;
    SendRequest(fd.get(), static_cast<uint32_t>(socket_plane::DataMethod::kPush), push.SerializeAsString());
    absl::StatusOr<RawReply> refused = ReadReply(fd.get());
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->header.code, static_cast<uint32_t>(absl::StatusCode::kAborted)) << refused->message;
    if (flags != 0) {
      EXPECT_TRUE(IsStaleView(StatusFromDetails(absl::StatusCode::kAborted, refused->message, refused->body)));
    } else {
      EXPECT_TRUE(refused->body.empty());
    }
  }
}

void SocketPlaneFixture::TwoWorkersStepExactly(const worker::SocketCalls::Endpoint& endpoint, size_t floats,
                                               bool values_segment) {
  std::vector<float> initial(floats);
  for (size_t i = 0; i < floats; ++i) initial[i] = static_cast<float>(i % 1000 + 1);
  uint64_t sessions[2];
  ASSERT_NO_FATAL_FAILURE(JoinTwo(initial, sessions));
  // (1 + 2) / 2 examples at lr 0.5: every weight moves by 0.75 a step.
  auto weights_at = [&](uint64_t version) {
    std::vector<float> w(floats);
    for (size_t i = 0; i < floats; ++i) w[i] = initial[i] - 0.75f * static_cast<float>(version);
    return w;
  };
  auto worker = [&](int rank) {
    SharedSegment values;  // outlives the transport given it
    worker::SocketCalls calls({endpoint}, "");
    std::vector<float> gradient(floats, rank + 1.0f);
    const float* pushed = gradient.data();
    if (values_segment) {
      absl::StatusOr<SharedSegment> made =
          SharedSegment::Create("test-values", (floats + 8) * sizeof(float), /*writable_by_others=*/false);
      ASSERT_TRUE(made.ok()) << made.status();
      values = *std::move(made);
      // At an offset: the place named is the values', not the segment's start.
      float* at = reinterpret_cast<float*>(values.data()) + 8;
      std::copy(gradient.begin(), gradient.end(), at);
      pushed = at;
      calls.ShareValues(&values);
    }
    for (uint64_t step = 0; step < kSteps; ++step) {
      pb::PushRequest push;
      push.set_rank(rank);
      push.set_session(sessions[rank]);
      push.set_step(step);
      push.set_partition(0);
      push.set_num_examples(1);
      push.set_dtype(pb::DTYPE_FLOAT32);
      grpc::ByteBuffer request, reply;
      if (values_segment) {
        request = EncodeWithBytes(push, pb::PushRequest::kDataFieldNumber, BorrowedSlice(pushed, floats * sizeof(float)));
      } else {
        push.set_data(pushed, floats * sizeof(float));
        grpc::Slice slice(push.SerializeAsString());
        request = grpc::ByteBuffer(&slice, 1);
      }
      calls.Start(0, 0, socket_plane::DataMethod::kPushPull, &request, &reply, absl::Now() + absl::Seconds(20));
      size_t tag = 99;
      absl::Status status;
      ASSERT_TRUE(calls.Next(&tag, &status));
      ASSERT_TRUE(status.ok()) << status;
      pb::PullResponse response;
      ASSERT_TRUE(response.ParseFromString(Flatten(reply)));
      ASSERT_EQ(response.version(), step + 1);
      const std::vector<float> expected = weights_at(step + 1);
      ASSERT_EQ(response.data(), std::string(reinterpret_cast<const char*>(expected.data()), floats * sizeof(float)))
          << "rank " << rank << ", step " << step;
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(server::ParameterServerPeer::Weights(*core_), weights_at(kSteps));
}

TEST_F(SocketPlaneTest, WorkersInThreadsTakeExactSyncStepsThroughPushPull) {
  StartPlane({}, {}, /*world_size=*/2);
  TwoWorkersStepExactly({"127.0.0.1", plane_->port()});
}

// The partitions of each event named `name` in a Chrome trace's JSON, in the file's order.
std::vector<int64_t> TracedPartitions(const std::string& json, const std::string& name) {
  std::vector<int64_t> partitions;
  const std::string event = absl::StrCat("\"name\": \"", name, "\"");
  const std::string partition = "\"partition\": ";
  for (size_t at = json.find(event); at != std::string::npos; at = json.find(event, at + 1)) {
    const size_t p = json.find(partition, at);
    if (p == std::string::npos) break;
    partitions.push_back(std::strtoll(json.c_str() + p + partition.size(), nullptr, 10));
  }
  return partitions;
}

TEST_F(SocketPlaneTest, AWorkersRepliesOfValuesAreWrittenTheEarliestPartitionFirst) {
  // Four partitions of 1 MiB. Rank 1 pushes each; then rank 0 push-pulls partitions 3, 2, 1 and 0,
  // each on a connection of its own that it does not read yet (a small receive buffer): each
  // completes its step as it arrives, 3's reply is written first and stalls, and 2, 1 and 0 wait
  // for their turn. Read at last, the replies must be written 3, 0, 1, 2 (in the order they
  // were ready: 3, 2, 1, 0), as the server's trace shows.
  constexpr int kPartitions = 4;
  constexpr size_t kFloats = (1 << 20) / sizeof(float);
  configure_ = [](ServerOptions& o) { o.partition_bytes = kFloats * sizeof(float); };
  const std::string trace_path = ::testing::TempDir() + "/reply_order_trace.json";
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Open(trace_path, "summa-server");
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  SocketPlaneOptions options;
  options.tracer = tracer->get();
  StartPlane(options, {}, /*world_size=*/2);
  uint64_t sessions[2];
  ASSERT_NO_FATAL_FAILURE(JoinTwo(std::vector<float>(kPartitions * kFloats, 1.0f), sessions));
  const std::vector<float> gradient(kFloats, 1.0f);
  auto push = [&](int rank, int partition) {
    pb::PushRequest push;
    push.set_rank(rank);
    push.set_session(sessions[rank]);
    push.set_step(0);
    push.set_partition(partition);
    push.set_num_examples(1);
    push.set_dtype(pb::DTYPE_FLOAT32);
    push.set_data(gradient.data(), kFloats * sizeof(float));
    return push.SerializeAsString();
  };
  const uint32_t kPush = static_cast<uint32_t>(socket_plane::DataMethod::kPush);
  const uint32_t kPushPull = static_cast<uint32_t>(socket_plane::DataMethod::kPushPull);
  socket_plane::OwnedFd pusher = Greeted();
  for (int p = 0; p < kPartitions; ++p) {
    SendRequest(pusher.get(), kPush, push(1, p));
    absl::StatusOr<RawReply> pushed = ReadReply(pusher.get());
    ASSERT_TRUE(pushed.ok() && pushed->header.code == 0) << pushed.status();
  }
  std::vector<socket_plane::OwnedFd> conns(kPartitions);
  for (int p = kPartitions - 1; p >= 0; --p) {
    conns[p] = Greeted();
    const int small = 16 << 10;
    ASSERT_EQ(::setsockopt(conns[p].get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    SendRequest(conns[p].get(), kPushPull, push(0, p));
    // Ready (its step complete) before the next is sent: the first is being written (its bytes
    // arrive), the rest wait for their turn.
    if (p == kPartitions - 1) {
      pollfd first = {conns[p].get(), POLLIN, 0};
      ASSERT_EQ(::poll(&first, 1, 10000), 1) << "the first reply is not being written";
      continue;
    }
    const int64_t waiting = kPartitions - 1 - p;
    ASSERT_TRUE(Eventually([&] { return plane_->replies_waiting_turn() == waiting; })) << plane_->replies_waiting_turn();
  }
  std::vector<std::thread> readers;
  std::vector<absl::Status> read(kPartitions);
  for (int p = 0; p < kPartitions; ++p) {
    readers.emplace_back([&, p] {
      absl::StatusOr<RawReply> reply = ReadReply(conns[p].get());
      read[p] = reply.ok() && reply->header.code != 0 ? absl::InternalError(reply->message) : reply.status();
    });
  }
  for (std::thread& t : readers) t.join();
  for (int p = 0; p < kPartitions; ++p) EXPECT_TRUE(read[p].ok()) << p << ": " << read[p];
  ASSERT_TRUE((*tracer)->Close().ok());
  std::ifstream in(trace_path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(TracedPartitions(json, "reply"), (std::vector<int64_t>{3, 0, 1, 2})) << json;
}

// The shared-memory plane: the same class on a Unix socket, with segments.
class ShmPlaneTest : public SocketPlaneFixture {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/summa-shm-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".sock");
    path_.resize(std::min<size_t>(path_.size(), 100));
  }
  void StartShm(SocketPlaneOptions options = {}, int world_size = 1) {
    options.shm_socket = path_;
    options.shm_instance = kInstance;
    StartPlane(options, {}, world_size);
  }
  worker::SocketCalls::Endpoint Endpoint(uint64_t instance = kInstance) const { return {"", 0, path_, instance}; }

  // A Unix connection to the plane that has passed its hello.
  socket_plane::OwnedFd UnixGreeted() {
    absl::StatusOr<socket_plane::OwnedFd> fd = socket_plane::ConnectUnix(path_, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return socket_plane::OwnedFd();
    uint64_t instance = 0;  // the server's first words
    EXPECT_TRUE(socket_plane::ReadFull(fd->get(), reinterpret_cast<char*>(&instance), sizeof(instance),
                                       absl::Now() + absl::Seconds(10), "the instance")
                    .ok());
    EXPECT_EQ(instance, kInstance);
    SendHello(fd->get(), "");
    absl::StatusOr<RawReply> hello = ReadReply(fd->get());
    EXPECT_TRUE(hello.ok() && hello->header.code == 0) << (hello.ok() ? hello->message : hello.status().ToString());
    return *std::move(fd);
  }

  // Sends an attach declaring `request_bytes` and `reply_bytes` with `segment` (-1: none); the
  // answer, and the reply segment's descriptor that came with it.
  struct Answer {
    uint32_t code = 0;
    std::string message;
    uint64_t reply_bytes = 0;
    uint64_t instance = 0;
    socket_plane::OwnedFd replies;
  };
  Answer Attach(int fd, uint64_t request_bytes, uint64_t reply_bytes, int segment) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    char attach[socket_plane::kAttachBytes];
    std::memcpy(attach, &request_bytes, 8);
    std::memcpy(attach + 8, &reply_bytes, 8);
    EXPECT_TRUE(socket_plane::SendWithFd(fd, attach, sizeof(attach), segment, deadline, "the attach").ok());
    Answer a;
    char head[socket_plane::kHeaderBytes];
    EXPECT_TRUE(socket_plane::ReceiveWithFd(fd, head, sizeof(head), &a.replies, deadline, "the answer").ok());
    const socket_plane::ReplyHeader h = socket_plane::DecodeReplyHeader(head);
    a.code = h.code;
    a.message.resize(h.message_length);
    EXPECT_TRUE(socket_plane::ReadFull(fd, a.message.data(), a.message.size(), deadline, "the message").ok());
    if (h.code == 0 && h.length == socket_plane::kAttachBytes) {
      char body[socket_plane::kAttachBytes];
      socket_plane::OwnedFd more;
      EXPECT_TRUE(socket_plane::ReceiveWithFd(fd, body, sizeof(body), &more, deadline, "the body").ok());
      if (!a.replies.valid()) a.replies = std::move(more);
      std::memcpy(&a.reply_bytes, body, 8);
      std::memcpy(&a.instance, body + 8, 8);
    }
    return a;
  }

  static constexpr uint64_t kInstance = 0x5eed5eed12345678;
  std::string path_;
};

TEST_F(ShmPlaneTest, WorkersInThreadsTakeExactSyncStepsWithTheirBytesInSegments) {
  StartShm({}, /*world_size=*/2);
  TwoWorkersStepExactly(Endpoint());
  // Every push and every reply went through the segments, none on the socket.
  EXPECT_EQ(plane_->requests_in_segments(), 40u);
  EXPECT_EQ(plane_->replies_in_segments(), 40u);
}

TEST_F(ShmPlaneTest, PushesFromAValuesSegmentAreSummedWhereTheyLieAndStepExactly) {
  StartShm({}, /*world_size=*/2);
  TwoWorkersStepExactly(Endpoint(), /*floats=*/4096, /*values_segment=*/true);
  EXPECT_EQ(plane_->requests_in_segments(), 2 * kSteps);
  EXPECT_EQ(plane_->values_in_place(), 2 * kSteps);
}

TEST_F(ShmPlaneTest, AValuesSegmentTooLargeIsRefusedAndPushesCopyTheirValues) {
  SocketPlaneOptions options;
  options.max_values_segment_bytes = 64 << 10;
  StartShm(options, /*world_size=*/2);
  // A segment larger than the plane takes: refused (the worker logs it), and the steps go on,
  // their values copied into the request segments.
  TwoWorkersStepExactly(Endpoint(), /*floats=*/32 << 10, /*values_segment=*/true);
  EXPECT_EQ(plane_->values_in_place(), 0u);
}

TEST_F(ShmPlaneTest, ValuesNamedOutsideTheValuesSegmentOrWithoutOneAreRefused) {
  StartShm();
  socket_plane::OwnedFd fd = UnixGreeted();
  absl::StatusOr<SharedSegment> requests =
      SharedSegment::Create("test-requests", SharedSegment::PageBytes(), /*writable_by_others=*/true);
  ASSERT_TRUE(requests.ok()) << requests.status();
  Answer attached = Attach(fd.get(), requests->size(), requests->size(), requests->fd());
  ASSERT_EQ(attached.code, 0u) << attached.message;
  // A request naming values [offset, +length) in the values segment, then its answer.
  auto call = [&](uint64_t offset, uint64_t length) {
    const uint64_t place[2] = {offset, length};
    std::memcpy(requests->data(), place, sizeof(place));
    char head[socket_plane::kHeaderBytes];
    socket_plane::EncodeRequestHeader(
        {static_cast<uint32_t>(socket_plane::DataMethod::kPush) | socket_plane::kInSegment |
             socket_plane::kValuesElsewhere,
         socket_plane::kValuesPlaceBytes, 0},
        head);
    SendBytes(fd.get(), std::string(head, sizeof(head)));
    return ReadReply(fd.get());
  };
  absl::StatusOr<RawReply> refused = call(0, 16);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->header.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(refused->message, "never sent")) << refused->message;
  // With a values segment of a page: past its end, and off a float's boundary.
  fd = UnixGreeted();
  attached = Attach(fd.get(), requests->size(), requests->size(), requests->fd());
  ASSERT_EQ(attached.code, 0u) << attached.message;
  absl::StatusOr<SharedSegment> values =
      SharedSegment::Create("test-values", SharedSegment::PageBytes(), /*writable_by_others=*/false);
  ASSERT_TRUE(values.ok()) << values.status();
  char head[socket_plane::kHeaderBytes];
  socket_plane::EncodeRequestHeader({socket_plane::kAttachValues, values->size(), 0}, head);
  ASSERT_TRUE(socket_plane::SendWithFd(fd.get(), head, sizeof(head), values->fd(), absl::Now() + absl::Seconds(10),
                                       "the values segment")
                  .ok());
  absl::StatusOr<RawReply> taken = ReadReply(fd.get());
  ASSERT_TRUE(taken.ok() && taken->header.code == 0) << (taken.ok() ? taken->message : taken.status().ToString());
  const uint64_t page = values->size();
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{page - 8, 16}, {0, page + 4}, {2, 8}, {~uint64_t{0} - 3, 8}}) {
    SCOPED_TRACE(absl::StrCat(offset, " +", length));
    fd = UnixGreeted();  // a refused request closes its connection
    attached = Attach(fd.get(), requests->size(), requests->size(), requests->fd());
    ASSERT_EQ(attached.code, 0u) << attached.message;
    ASSERT_TRUE(socket_plane::SendWithFd(fd.get(), head, sizeof(head), values->fd(),
                                         absl::Now() + absl::Seconds(10), "the values segment")
                    .ok());
    taken = ReadReply(fd.get());
    ASSERT_TRUE(taken.ok() && taken->header.code == 0);
    refused = call(offset, length);
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->header.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument)) << refused->message;
    EXPECT_TRUE(absl::StrContains(refused->message, "of a values segment of")) << refused->message;
  }
  EXPECT_EQ(plane_->values_in_place(), 0u);
}

TEST_F(ShmPlaneTest, AMessageLargerThanTheSegmentsGoesOnTheSocketAndASumInAPublishedSegmentIsNamed) {
  StartShm();
  // Segments of one page. A 32 KiB AllReduce fits neither way: both on the socket. A 64 KiB one
  // does not fit either, but its sum is a published segment (Snapshot::kSharedBytes): the reply
  // names it.
  worker::SocketCalls calls({Endpoint()}, "", nullptr, /*segment_bytes=*/1);
  uint64_t replies_in_segments = 0;
  for (size_t floats : {8 << 10, 16 << 10}) {
    SCOPED_TRACE(floats);
    std::vector<float> values(floats);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    grpc::Slice slice(AllReduceMessage(absl::StrCat("big", floats), 1, 0, values));
    grpc::ByteBuffer request(&slice, 1), reply;
    calls.Start(0, 0, socket_plane::DataMethod::kAllReduce, &request, &reply, absl::Now() + absl::Seconds(10));
    size_t tag = 99;
    absl::Status status;
    ASSERT_TRUE(calls.Next(&tag, &status));
    ASSERT_TRUE(status.ok()) << status;
    pb::AllReduceResponse response;
    ASSERT_TRUE(response.ParseFromString(Flatten(reply)));
    EXPECT_EQ(response.tensor().data(), std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
    EXPECT_EQ(plane_->requests_in_segments(), 0u);
    if (floats * 4 >= static_cast<size_t>(Snapshot::kSharedBytes)) ++replies_in_segments;
    EXPECT_EQ(plane_->replies_in_segments(), replies_in_segments);
  }
}

TEST_F(ShmPlaneTest, PublishedWeightsAreReadStepAfterStepWhileTheServerWritesTheNextVersion) {
  // A partition of 128 KiB (Snapshot::kSharedBytes and more): every reply's weights are a
  // published segment's, which the server writes a new version into only once no reply names it.
  StartShm({}, /*world_size=*/2);
  TwoWorkersStepExactly(Endpoint(), /*floats=*/32 << 10);
  EXPECT_EQ(plane_->replies_in_segments(), 2 * kSteps);
}

TEST_F(ShmPlaneTest, RepliesHeldInSegmentsSurviveMoreCallsThanConnections) {
  StartShm();
  // More calls in flight at once than a shard may have connections: the replies of the first
  // calls are moved aside when their connections are taken, and every reply stays intact until
  // all are read (as an AllReduce's chunks are, after the last one ends).
  worker::SocketCalls calls({Endpoint()}, "");
  constexpr size_t kCalls = worker::SocketCalls::kMaxConnectionsPerShard + 8;
  std::vector<grpc::ByteBuffer> requests(kCalls), replies(kCalls);
  for (size_t k = 0; k < kCalls; ++k) {
    grpc::Slice slice(AllReduceMessage(absl::StrCat("c", k), 1, 0, {static_cast<float>(k), 1, 2}));
    requests[k] = grpc::ByteBuffer(&slice, 1);
    calls.Start(k, 0, socket_plane::DataMethod::kAllReduce, &requests[k], &replies[k], absl::Now() + absl::Seconds(20));
  }
  for (size_t done = 0; done < kCalls; ++done) {
    size_t tag;
    absl::Status status;
    ASSERT_TRUE(calls.Next(&tag, &status));
    ASSERT_TRUE(status.ok()) << status;
  }
  for (size_t k = 0; k < kCalls; ++k) {
    pb::AllReduceResponse response;
    ASSERT_TRUE(response.ParseFromString(Flatten(replies[k]))) << k;
    const std::vector<float> want = {static_cast<float>(k), 1, 2};
    EXPECT_EQ(response.tensor().data(), std::string(reinterpret_cast<const char*>(want.data()), 12)) << "call " << k;
  }
  EXPECT_EQ(plane_->replies_in_segments(), kCalls);
}

TEST_F(ShmPlaneTest, ASegmentUnsealedMissizedOrLargerThanAnyRequestIsRefusedWithWhatIsWrong) {
  SocketPlaneOptions options;
  options.max_message_bytes = 1 << 20;
  StartShm(options);
  const uint64_t page = SharedSegment::PageBytes();
  struct Case {
    std::string what;
    uint64_t bytes;     // made
    uint64_t declared;  // said
    bool sealed;
    bool send;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"no segment", page, page, true, false, "the attach carried no request segment"},
      {"unsealed", page, page, false, true, "is not sealed against shrinking"},
      {"missized", 2 * page, page, true, true, "holds 8192 bytes, not the 4096 its sender declared"},
      {"too large", 2 << 20, 2 << 20, true, true, "is larger than the"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    socket_plane::OwnedFd fd = UnixGreeted();
    const int segment = ::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_GE(segment, 0);
    ASSERT_EQ(::ftruncate(segment, static_cast<off_t>(c.bytes)), 0);
    if (c.sealed) {
      ASSERT_EQ(::fcntl(segment, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    Answer a = Attach(fd.get(), c.declared, page, c.send ? segment : -1);
    ::close(segment);
    EXPECT_EQ(a.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(absl::StrContains(a.message, c.says)) << a.message;
    if (c.what == "too large") {
      EXPECT_TRUE(absl::StrContains(a.message, "--max_message_bytes=1048576")) << a.message;
    }
    EXPECT_FALSE(a.replies.valid());
    EXPECT_TRUE(ClosedByServer(fd.get()));
  }
  // A reply segment larger than any reply is refused too.
  socket_plane::OwnedFd fd = UnixGreeted();
  absl::StatusOr<SharedSegment> mine = SharedSegment::Create("test", page, /*writable_by_others=*/true);
  ASSERT_TRUE(mine.ok()) << mine.status();
  Answer a = Attach(fd.get(), page, 64 << 20, mine->fd());
  EXPECT_EQ(a.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(a.message, "a reply segment of 67108864 bytes asked for")) << a.message;
}

TEST_F(ShmPlaneTest, TheReplySegmentCanBeMappedForReadingAndNeverWritten) {
  StartShm();
  socket_plane::OwnedFd fd = UnixGreeted();
  const uint64_t page = SharedSegment::PageBytes();
  absl::StatusOr<SharedSegment> mine = SharedSegment::Create("test", page, /*writable_by_others=*/true);
  ASSERT_TRUE(mine.ok()) << mine.status();
  Answer a = Attach(fd.get(), page, page, mine->fd());
  ASSERT_EQ(a.code, 0u) << a.message;
  ASSERT_TRUE(a.replies.valid());
  EXPECT_EQ(a.instance, kInstance);
  EXPECT_EQ(a.reply_bytes, page);
  void* read = ::mmap(nullptr, page, PROT_READ, MAP_SHARED, a.replies.get(), 0);
  EXPECT_NE(read, MAP_FAILED) << std::strerror(errno);
  if (read != MAP_FAILED) {
    // Nor can the read-only mapping be made writable.
    EXPECT_NE(::mprotect(read, page, PROT_READ | PROT_WRITE), 0);
    ::munmap(read, page);
  }
  EXPECT_EQ(::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, a.replies.get(), 0), MAP_FAILED);
  EXPECT_LT(::write(a.replies.get(), "x", 1), 0);
  // Opened again for writing (the same user may), the seal still refuses every write.
  const std::string again = absl::StrCat("/proc/self/fd/", a.replies.get());
  socket_plane::OwnedFd writable(::open(again.c_str(), O_RDWR | O_CLOEXEC));
  if (writable.valid()) {
    EXPECT_EQ(::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, writable.get(), 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    EXPECT_LT(::write(writable.get(), "x", 1), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(::ftruncate(writable.get(), 0), 0);
  }
}

TEST_F(ShmPlaneTest, ARequestOutsideItsSegmentOrInOneWithoutASegmentIsRefused) {
  StartShm();
  socket_plane::OwnedFd fd = UnixGreeted();
  const uint64_t page = SharedSegment::PageBytes();
  absl::StatusOr<SharedSegment> mine = SharedSegment::Create("test", page, /*writable_by_others=*/true);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_EQ(Attach(fd.get(), page, page, mine->fd()).code, 0u);
  char head[socket_plane::kHeaderBytes];
  socket_plane::EncodeRequestHeader({kAllReduceMethod | socket_plane::kInSegment, page, 4}, head);
  SendBytes(fd.get(), std::string(head, sizeof(head)));
  absl::StatusOr<RawReply> reply = ReadReply(fd.get());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(reply->message, absl::StrCat("a request at bytes [4, ", page + 4, ") of a request segment of ", page));
  // On the TCP plane the flag makes no method at all.
  plane_->Stop();
  plane_.reset();
  StartPlane();
  socket_plane::OwnedFd tcp = Greeted();
  SendRequest(tcp.get(), kAllReduceMethod | socket_plane::kInSegment, "");
  reply = ReadReply(tcp.get());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(reply->message, "no data-path method numbered")) << reply->message;
}

TEST_F(ShmPlaneTest, AClientRefusesASocketThatAnotherServerAnswers) {
  StartShm();
  worker::SocketCalls calls({Endpoint(kInstance + 1)}, "");
  const absl::Status opened = calls.Open(0, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(opened)) << opened;
  EXPECT_TRUE(absl::StrContains(opened.message(), "belongs to another server")) << opened;
  worker::SocketCalls right({Endpoint()}, "");
  EXPECT_TRUE(right.Open(0, absl::Now() + absl::Seconds(10)).ok());
}

TEST_F(ShmPlaneTest, AClientSendsNoTokenToASocketThatDoesNotSayTheServersInstance) {
  // Someone else's socket at the path (a world-writable directory on the worker's host): it says
  // another instance, and the client goes without a byte of its hello.
  absl::StatusOr<socket_plane::OwnedFd> impostor = socket_plane::ListenUnix(path_, 0666);
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  std::string heard;
  std::thread listen([&] {
    const int fd = ::accept4(impostor->get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    const uint64_t wrong = kInstance + 1;
    ::send(fd, &wrong, sizeof(wrong), MSG_NOSIGNAL);
    char buffer[256];
    for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) heard.append(buffer, n);
    ::close(fd);
  });
  auto calls = std::make_unique<worker::SocketCalls>(std::vector<worker::SocketCalls::Endpoint>{Endpoint()},
                                                     "Bearer secret");
  const absl::Status opened = calls->Open(0, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(opened)) << opened;
  EXPECT_TRUE(absl::StrContains(opened.message(), "belongs to another server")) << opened;
  EXPECT_TRUE(calls->lost());  // the client asks where the plane is again
  calls.reset();  // whatever it still held closes: the impostor's read ends
  listen.join();
  EXPECT_EQ(heard, "") << "the client said something to a socket that is not its server's";
  ::unlink(path_.c_str());
}

TEST_F(ShmPlaneTest, ALiveServersSocketIsNotTakenAndAStaleOneIs) {
  StartShm();
  SocketPlaneOptions again;
  again.shm_socket = path_;
  absl::StatusOr<std::unique_ptr<SocketPlane>> second = SocketPlane::Start("", service_.get(), &tokens_, again);
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "another process listens there")) << second.status();
  // A socket left by a server that died (bound, never closed by it, no one listening): taken.
  plane_->Stop();
  plane_.reset();
  {
    absl::StatusOr<socket_plane::OwnedFd> stale = socket_plane::ListenUnix(path_, 0600);
    ASSERT_TRUE(stale.ok()) << stale.status();
  }  // closed, the file left behind
  struct stat st = {};
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  StartShm();
  worker::SocketCalls calls({Endpoint()}, "");
  EXPECT_TRUE(calls.Open(0, absl::Now() + absl::Seconds(10)).ok());
}

TEST_F(ShmPlaneTest, AHelloWithoutTheTokenGetsNoSegment) {
  SocketPlaneOptions options;
  options.shm_socket = path_;
  options.shm_instance = kInstance;
  StartPlane(options, TokenCheck("secret", "", false));
  worker::SocketCalls wrong({Endpoint()}, "Bearer guess");
  const absl::Status opened = wrong.Open(0, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnauthenticated(opened)) << opened;
  worker::SocketCalls right({Endpoint()}, "Bearer secret");
  EXPECT_TRUE(right.Open(0, absl::Now() + absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace summa::server
