// Limits at the service's edge (server/core/limits.h as server/rpc/service.cc applies them): parked
// calls per peer, AllReduce bytes in flight per address, message and model sizes, the join rate;
// each refusal is RESOURCE_EXHAUSTED naming its flag. And gRPC's handshake timeout, which bounds
// how long a connection that never speaks is held. The daemon in-process on 127.0.0.1:0.
#include "server/daemon.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/socket_frame.h"
#include "gtest/gtest.h"
#include "tests/service_fixtures.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa::server {
namespace {

pb::ServerStatus StatusOf(pb::ParameterServer::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::ServerStatus status;
  EXPECT_TRUE(stub.GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
  return status;
}

// Polls GetStatus until `done` holds, for at most 20 s (a call parks as soon as the server has
// it; the poll only waits for it to get there).
template <typename Done>
bool StatusReaches(pb::ParameterServer::Stub& stub, Done done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    if (done(StatusOf(stub))) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// A call sent with the callback API, answered later.
template <typename Response>
struct PendingCall {
  grpc::ClientContext ctx;
  Response response;
  absl::Notification done;
  grpc::Status status;
};

// A connection to the gRPC port that never sends HTTP/2's preface is closed once gRPC's handshake
// timeout passes (common/rpc/server_builder.h's kServerHandshakeTimeoutMs; gRPC's own default
// would hold it 120 s): anyone who reaches the port holds a connection no longer than that.
TEST_F(ServiceTest, AConnectionThatSendsNothingIsClosed) {
  StartServer(1);
  absl::StatusOr<socket_plane::OwnedFd> fd =
      socket_plane::Connect("127.0.0.1", server_->port(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(fd.ok()) << fd.status();
  // Far past the timeout, and far short of gRPC's default. What the server sends first (its
  // SETTINGS) is read and dropped; the end of the stream is what counts.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  absl::Status read;
  char byte;
  while ((read = socket_plane::ReadFull(fd->get(), &byte, 1, give_up, "the end")).ok()) {
  }
  EXPECT_TRUE(absl::IsUnavailable(read)) << read;
}

TEST_F(ServiceTest, ParkedCallsAreBoundedPerPeerAndOtherPeersKeepTheirShare) {
  LimitOptions limits;
  limits.max_parked_calls_per_peer = 2;
  StartServer(2, 4 << 20, limits);
  auto stub = Stub();
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::JoinResponse r;
    ASSERT_TRUE(stub->Join(&ctx, JoinMsg(0, 2, true), &r).ok());
    grpc::ClientContext ctx1;
    Deadline(ctx1);
    ASSERT_TRUE(stub->Join(&ctx1, JoinMsg(1, 2, false), &r).ok());
  }
  auto pull = [&](int rank, PendingCall<pb::PullResponse>& call) {
    pb::PullRequest req;
    req.set_rank(rank);
    req.set_partition(0);
    req.set_min_version(1);  // step 0 is not done: the pull parks
    Deadline(call.ctx);
    stub->async()->Pull(&call.ctx, &req, &call.response, [&call](grpc::Status s) {
      call.status = std::move(s);
      call.done.Notify();
    });
  };
  PendingCall<pb::PullResponse> first, second, other;
  pull(0, first);
  pull(0, second);
  ASSERT_TRUE(StatusReaches(*stub, [](const pb::ServerStatus& s) { return s.parked_calls() == 2; }));

  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::PullRequest req;
  req.set_rank(0);
  req.set_min_version(1);
  pb::PullResponse refused;
  grpc::Status s = stub->Pull(&ctx, req, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("rank 0 holds 2 parked calls"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_parked_calls_per_peer"), std::string::npos) << s.error_message();

  pull(1, other);  // rank 1's share is its own
  ASSERT_TRUE(StatusReaches(*stub, [](const pb::ServerStatus& s) { return s.parked_calls() == 3; }));
  for (int rank = 0; rank < 2; ++rank) {
    pb::PushRequest push;
    push.set_rank(rank);
    push.set_partition(0);
    push.set_num_examples(1);
    push.set_dtype(pb::DTYPE_FLOAT32);
    push.set_data(Bytes(std::vector<float>(8, 1)));
    grpc::ClientContext pctx;
    Deadline(pctx);
    pb::PushResponse pushed;
    ASSERT_TRUE(stub->Push(&pctx, push, &pushed).ok());
  }
  for (auto* call : {&first, &second, &other}) {
    call->done.WaitForNotification();
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
    EXPECT_EQ(call->response.version(), 1u);
  }
  EXPECT_TRUE(StatusReaches(*stub, [](const pb::ServerStatus& s) { return s.parked_calls() == 0; }));
}

TEST_F(ServiceTest, AllReduceBytesInFlightAreBoundedPerAddress) {
  LimitOptions limits;
  limits.max_bytes_in_flight_per_peer = 64;
  StartServer(1, 4 << 20, limits);
  auto stub = Stub();
  auto request = [](const std::string& name, int rank, int floats) {
    pb::AllReduceRequest r;
    r.set_name(name);
    r.set_group_size(2);
    r.set_rank(rank);
    r.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
    r.mutable_tensor()->add_shape(floats);
    r.mutable_tensor()->set_data(Bytes(std::vector<float>(floats, 1)));
    return r;
  };
  PendingCall<pb::AllReduceResponse> waiting;
  Deadline(waiting.ctx);
  const pb::AllReduceRequest first = request("a", 0, 6);  // 24 bytes, held until the round completes
  stub->async()->AllReduce(&waiting.ctx, &first, &waiting.response, [&waiting](grpc::Status s) {
    waiting.status = std::move(s);
    waiting.done.Notify();
  });
  ASSERT_TRUE(StatusReaches(*stub, [](const pb::ServerStatus& s) { return s.parked_calls() == 1; }));
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::AllReduceResponse r;
    grpc::Status s = stub->AllReduce(&ctx, request("b", 0, 12), &r);  // 24 + 48 > 64
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("--max_bytes_in_flight_per_peer"), std::string::npos) << s.error_message();
  }
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::AllReduceResponse r;
  grpc::Status s = stub->AllReduce(&ctx, request("a", 1, 6), &r);  // 24 + 24: completes the round
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Floats(r.tensor().data()), std::vector<float>(6, 2));
  waiting.done.WaitForNotification();
  EXPECT_TRUE(waiting.status.ok()) << waiting.status.error_message();
  const pb::ServerStatus status = StatusOf(*stub);
  EXPECT_EQ(status.allreduce_collectives(), 1);  // "b" was refused at the edge, before the hub
  EXPECT_EQ(status.allreduce_buffer_bytes(), 24);
}

TEST_F(ServiceTest, AMessageOverTheLimitIsRefusedNamingTheFlag) {
  LimitOptions limits;
  limits.max_message_bytes = (4 << 20) + (64 << 10);  // the least a 4 MiB partition allows
  StartServer(1, 4 << 20, limits);
  auto stub = Stub();
  pb::PushRequest push;
  push.set_data(std::string(limits.max_message_bytes + 1, '\0'));
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::PushResponse r;
  const absl::Status s = FromGrpcStatus(stub->Push(&ctx, push, &r));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("--max_message_bytes"), std::string::npos) << s;
}

TEST_F(ServiceTest, JoinsPastTheRateAreRefusedNamingTheFlag) {
  FakeClock clock;  // still: no token comes back during the test
  LimitOptions limits;
  limits.join_rate = 1;
  StartServer(1, 4 << 20, limits, &clock);  // a burst of max(1, 2 x 1) = 2
  auto stub = Stub();
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    pb::JoinResponse r;
    grpc::Status s = stub->Join(&ctx, JoinMsg(0, 1, true), &r);
    if (i < 2) {
      EXPECT_TRUE(s.ok()) << i << ": " << s.error_message();
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_NE(s.error_message().find("--join_rate"), std::string::npos) << s.error_message();
    }
  }
  clock.Advance(absl::Seconds(1));
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::JoinResponse r;
  EXPECT_TRUE(stub->Join(&ctx, JoinMsg(0, 1, true), &r).ok());
}

TEST_F(ServiceTest, AModelOverTheLimitIsRefusedBeforeAnythingIsAllocated) {
  LimitOptions limits;
  limits.max_model_bytes = 16;  // four floats; JoinMsg declares eight
  StartServer(1, 4 << 20, limits);
  auto stub = Stub();
  grpc::ClientContext ctx;
  Deadline(ctx);
  pb::JoinResponse r;
  grpc::Status s = stub->Join(&ctx, JoinMsg(0, 1, false), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_model_bytes"), std::string::npos) << s.error_message();
  EXPECT_FALSE(StatusOf(*stub).model_defined());
}

}  // namespace
}  // namespace summa::server
