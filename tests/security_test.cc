// The probes of the security issue, against a real server on 127.0.0.1:0 with certificates and
// tokens from scripts/make-certs.sh: TLS and mutual-TLS round trips, plaintext and certificate-
// less clients refused, tokens (none, wrong, worker on an admin call), a push from a client that
// never joined, a certificate rotated on disk picked up without a restart, and the plaintext
// health-only port beside a TLS one (for kubelet's probes, which cannot speak TLS). Tokens scoped
// to a rank: a Join and every member call as another rank refused on gRPC and on the socket data
// plane, changing nothing (the rank's holder keeps its session); calls for the whole job refused
// to a scoped token. (The token files' syntax and rotation: tests/tokens_test.cc.)
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

#include "common/rpc/health_service.h"
#include "common/rpc/server_builder.h"
#include "common/rpc/transport.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "server/rpc/method_roles.h"
#include "summa/v1/summa.grpc.pb.h"
#include "client/ps_client.h"
#include "tests/socket_frames.h"
#include "tests/test_certs.h"

namespace summa {
namespace {

namespace pb = ::summa::v1;

using test::MakeCerts;
// A token file's token.
std::string Read(const std::string& path) { return test::ReadTrimmed(path); }

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { certs_ = MakeCerts("main"); }

  void Start(bool mutual, bool status_needs_token = false, const std::string& health_address = "") {
    server::ServerOptions o;
    o.world_size = 1;
    o.barrier_deadline = absl::Seconds(20);
    EndpointSecurity security;
    security.tls = {certs_ + "/server.pem", certs_ + "/server.key", mutual ? certs_ + "/ca.pem" : ""};
    security.tokens = TokenCheck(Read(certs_ + "/worker.token"), Read(certs_ + "/admin.token"), status_needs_token);
    auto s = server::SummaServer::Start("127.0.0.1:0", o, "", security, health_address);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  ClientSecurity Client(bool with_cert, const std::string& token_file) {
    ClientSecurity c;
    c.tls = {with_cert ? certs_ + "/client.pem" : "", with_cert ? certs_ + "/client.key" : "", certs_ + "/ca.pem"};
    if (!token_file.empty()) c.token = Read(certs_ + "/" + token_file);
    return c;
  }

  absl::Status JoinWith(ClientSecurity security) {
    worker::ParameterClient client(address_, absl::Seconds(5), absl::Seconds(2), 1, std::move(security));
    std::vector<float> w = {1, 2, 3, 4};
    absl::StatusOr<worker::JoinInfo> joined = client.Join(0, 1, {{"w", DType::kFloat32, {4}}}, w.data(), "");
    if (!joined.ok()) return joined.status();
    std::vector<float> pulled(4);
    absl::StatusOr<uint64_t> v = client.PullAll(0, pulled.data());
    if (!v.ok()) return v.status();
    EXPECT_EQ(pulled, w);
    return absl::OkStatus();
  }

  // A typed stub over TLS with the given token.
  grpc::Status Call(const std::string& what, const std::string& token, bool with_cert = true) {
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, ChannelCredentialsFor(Client(with_cert, "").tls)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    AttachToken(token, &ctx);
    if (what == "status") {
      pb::ServerStatus r;
      return stub->GetStatus(&ctx, pb::GetStatusRequest(), &r);
    }
    if (what == "checkpoint") {
      pb::CheckpointResponse r;
      return stub->Checkpoint(&ctx, pb::CheckpointRequest(), &r);
    }
    pb::PushRequest push;  // a client that never joined, pushing as rank 0
    push.set_rank(0);
    push.set_dtype(pb::DTYPE_FLOAT32);
    push.set_num_examples(1);
    push.set_data(std::string(16, '\0'));
    pb::PushResponse r;
    return stub->Push(&ctx, push, &r);
  }

  std::string certs_;
  std::unique_ptr<server::SummaServer> server_;
  std::string address_;
};

TEST_F(SecurityTest, MutualTlsRoundTripAndWhoIsRefused) {
  Start(/*mutual=*/true);
  EXPECT_TRUE(JoinWith(Client(/*with_cert=*/true, "worker.token")).ok());
  // No client certificate: the handshake fails.
  EXPECT_EQ(JoinWith(Client(/*with_cert=*/false, "worker.token")).code(), absl::StatusCode::kUnavailable);
  // Plaintext against TLS.
  ClientSecurity plain;
  plain.token = Read(certs_ + "/worker.token");
  plain.tls = {};
  EXPECT_EQ(JoinWith(plain).code(), absl::StatusCode::kUnavailable);
}

// Two shards under mutual TLS and tokens, as summa-server --coordinator runs them: shard 1 reports
// to shard 0 with the server's own certificate and key as its client identity, shard 0 lists it,
// healthy; a worker joins both shards and takes a step through each one's partition.
TEST_F(SecurityTest, TwoShardsUnderMutualTlsReportToShardZeroAndServeAWorker) {
  server::ServerOptions o;
  o.world_size = 1;
  o.shards = 2;
  o.partition_bytes = 8;  // a model of 4 floats: one partition of 2 on each shard
  o.optimizer.learning_rate = 1.0;
  o.barrier_deadline = absl::Seconds(20);
  EndpointSecurity security;
  security.tls = {certs_ + "/server.pem", certs_ + "/server.key", certs_ + "/ca.pem"};
  security.tokens = TokenCheck(Read(certs_ + "/worker.token"), Read(certs_ + "/admin.token"), false);
  auto zero = server::SummaServer::Start("127.0.0.1:0", o, "", security);
  ASSERT_TRUE(zero.ok()) << zero.status();
  const std::string zero_address = "127.0.0.1:" + std::to_string((*zero)->port());
  server::Coordinator coordinator;
  coordinator.address = zero_address;
  coordinator.security.tls = {certs_ + "/server.pem", certs_ + "/server.key", certs_ + "/ca.pem"};
  coordinator.security.token = Read(certs_ + "/worker.token");
  o.shard = 1;
  auto one = server::SummaServer::Start("127.0.0.1:0", o, "", security, "", coordinator);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::string one_address = "127.0.0.1:" + std::to_string((*one)->port());

  auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(zero_address, ChannelCredentialsFor(Client(true, "").tls)));
  pb::ServerStatus status;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    status.Clear();
    if (stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok() && status.shard_statuses_size() == 2 &&
        status.shard_statuses(1).healthy()) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline) << "shard 1 never reported over TLS: " << status.DebugString();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(status.shard_statuses(1).shard(), 1);

  worker::ParameterClient client(zero_address + "," + one_address, absl::Seconds(5), absl::Seconds(5), 1,
                                 Client(/*with_cert=*/true, "worker.token"));
  const std::vector<float> initial = {1, 2, 3, 4};
  absl::StatusOr<worker::JoinInfo> joined = client.Join(0, 1, {{"w", DType::kFloat32, {4}}}, initial.data(), "");
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->partitions.size(), 2u);
  const std::vector<float> grad = {1, 1, 1, 1};
  std::vector<float> w(4);
  absl::Status stepped = client.PushPull(0, 1, grad.data(), w.data(), nullptr).status();
  ASSERT_TRUE(stepped.ok()) << stepped;
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2, 3}));  // lr 1, the gradient over 1 example
}

TEST_F(SecurityTest, TlsWithoutClientCertificatesAndTheTokens) {
  Start(/*mutual=*/false);
  EXPECT_TRUE(JoinWith(Client(/*with_cert=*/false, "worker.token")).ok());
  EXPECT_EQ(JoinWith(Client(false, "")).code(), absl::StatusCode::kUnauthenticated);
  const std::string worker = Read(certs_ + "/worker.token");
  const std::string admin = Read(certs_ + "/admin.token");
  EXPECT_EQ(Call("push", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call("push", worker + "x").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The spoofed push, with a good token but no membership: refused, nothing summed.
  grpc::Status spoofed = Call("push", worker);
  EXPECT_EQ(spoofed.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << spoofed.error_message();
  EXPECT_EQ(server_->core().Status().pushes_served, 0u);
  // Admin calls: a worker token is not enough.
  grpc::Status denied = Call("checkpoint", worker);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_EQ(Call("checkpoint", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The admin token gets through to the call itself (this server keeps no checkpoints).
  EXPECT_EQ(Call("checkpoint", admin).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The status stays readable without a token.
  EXPECT_TRUE(Call("status", "").ok());
}

// A call of `method` (its name in summa.v1.ParameterServer) with an empty request and `token`,
// over TLS: the status it ends with (a call let through may wait for others: its deadline ends it).
grpc::StatusCode CallMethodWithToken(const std::string& address,
                                     const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                     const std::string& method, const std::string& token) {
  grpc::GenericStub stub(grpc::CreateChannel(address, credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  AttachToken(token, &ctx);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, absl::StrCat("/", pb::ParameterServer::service_full_name(), "/", method),
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status.error_code();
}

// The guard is one table (server/rpc/method_roles.h): every method the service's descriptor
// lists is in it, and each is refused without a token, with a wrong one, and with a worker's
// where the table asks an admin's; the token it names lets the call through to its handler.
// Status methods are open without a token unless --status_needs_token.
TEST_F(SecurityTest, EveryMethodOfTheServiceIsRefusedWithoutTheTokenItsRoleNeeds) {
  const std::string worker = Read(certs_ + "/worker.token");
  const std::string admin = Read(certs_ + "/admin.token");
  const auto credentials = ChannelCredentialsFor(Client(false, "").tls);
  const google::protobuf::ServiceDescriptor* service =
      pb::JoinRequest::descriptor()->file()->FindServiceByName("ParameterServer");
  ASSERT_NE(service, nullptr);
  ASSERT_GT(service->method_count(), 10);
  for (bool status_needs_token : {true, false}) {
    Start(/*mutual=*/false, status_needs_token);
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method = service->method(i)->name();
      SCOPED_TRACE(absl::StrCat(method, status_needs_token ? ", status needs a token" : ""));
      bool listed = false;
      for (const server::MethodRole& m : server::kMethodRoles) listed |= m.method == method;
      EXPECT_TRUE(listed) << method << " is not in server/rpc/method_roles.h";
      const auto call = [&](const std::string& token) {
        return CallMethodWithToken(address_, credentials, method, token);
      };
      const Role role = server::RequiredRole(method);
      if (role == Role::kStatus && !status_needs_token) {
        EXPECT_NE(call(""), grpc::StatusCode::UNAUTHENTICATED);
        continue;
      }
      EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(call(worker + "x"), grpc::StatusCode::UNAUTHENTICATED);
      const grpc::StatusCode as_worker = call(worker);
      if (role == Role::kAdmin) {
        EXPECT_EQ(as_worker, grpc::StatusCode::PERMISSION_DENIED);
      } else {
        EXPECT_NE(as_worker, grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_NE(as_worker, grpc::StatusCode::UNAUTHENTICATED);
      }
      const grpc::StatusCode as_admin = call(admin);
      EXPECT_NE(as_admin, grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_NE(as_admin, grpc::StatusCode::UNAUTHENTICATED);
    }
  }
}

TEST_F(SecurityTest, StatusBehindATokenWhenAsked) {
  Start(/*mutual=*/false, /*status_needs_token=*/true);
  EXPECT_EQ(Call("status", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call("status", Read(certs_ + "/worker.token")).ok());
}

TEST_F(SecurityTest, ARotatedCertificateIsServedWithoutARestart) {
  Start(/*mutual=*/false);
  EXPECT_TRUE(Call("status", "").ok());
  // A new CA and server certificate replace the files the server watches.
  const std::string fresh = MakeCerts("rotated");
  std::filesystem::copy_file(fresh + "/server.pem", certs_ + "/server.pem", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(fresh + "/server.key", certs_ + "/server.key", std::filesystem::copy_options::overwrite_existing);
  // Clients that trust the new CA get through once the server has read the files again.
  auto with_ca = [&](const std::string& ca) {
    TlsFiles tls{"", "", ca};
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, ChannelCredentialsFor(tls)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    pb::ServerStatus r;
    return stub->GetStatus(&ctx, pb::GetStatusRequest(), &r);
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(4 * kCertificateRefreshSeconds);
  grpc::Status s = with_ca(fresh + "/ca.pem");
  while (!s.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(200));
    s = with_ca(fresh + "/ca.pem");
  }
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(with_ca(certs_ + "/ca.pem").ok()) << "the old CA no longer vouches for the server";
}

// A plaintext server of two ranks whose --token_file lists a bare token and one token for each
// rank, with an admin token and the socket data plane: rank 0 and rank 1 joined, each with its
// own token (rank 1's Join, the first, asked for rank -1: its token's rank).
class ScopedTokenTest : public ::testing::Test {
 protected:
  static constexpr const char* kDenied = "this token is rank 0's (--token_file); it cannot act as rank 1";

  void SetUp() override {
    const std::string dir = ::testing::TempDir() + "/security_test_scoped_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                            std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/workers") << "# the job's\nbare-token\n# each rank's\nzero-token rank=0\none-token rank=1\n";
    std::ofstream(dir + "/admin") << "admin-token\n";
    absl::StatusOr<TokenCheck> tokens = TokenCheck::Load({dir + "/workers", dir + "/admin"});
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    server::ServerOptions o;
    o.world_size = 2;
    o.optimizer.learning_rate = 1.0;
    o.barrier_deadline = absl::Seconds(20);
    EndpointSecurity security;
    security.tokens = *std::move(tokens);
    auto s = server::SummaServer::Start("127.0.0.1:0", o, "", security, "", {}, "127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    zero_ = Member("zero-token");
    one_ = Member("one-token");
    // Rank 1's first: the server would assign rank 0 to a Join for rank -1 by any other token.
    absl::StatusOr<worker::JoinInfo> joined = one_->Join(-1, 2, Specs(), kInitial.data(), "");
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->rank, 1) << "a scoped token's Join for rank -1 is its rank's";
    joined = zero_->Join(0, 2, Specs(), kInitial.data(), "");
    ASSERT_TRUE(joined.ok()) << joined.status();
  }

  std::unique_ptr<worker::ParameterClient> Member(const std::string& token) {
    auto client = std::make_unique<worker::ParameterClient>(address_, absl::Seconds(10), absl::Seconds(5), 1,
                                                            ClientSecurity{{}, token});
    client->set_data_plane(worker::DataPlane::kSocket);
    return client;
  }
  static std::vector<TensorSpec> Specs() { return {{"w", DType::kFloat32, {4}}}; }

  // Both ranks take step 0 of gradient 1: each is still a member, with its session.
  void BothStep() {
    const std::vector<float> grad = {1, 1, 1, 1};
    std::vector<float> w0(4), w1(4);
    absl::Status s0, s1;
    std::thread t([&] { s1 = one_->PushPull(0, 1, grad.data(), w1.data(), nullptr).status(); });
    s0 = zero_->PushPull(0, 1, grad.data(), w0.data(), nullptr).status();
    t.join();
    ASSERT_TRUE(s0.ok()) << s0;
    ASSERT_TRUE(s1.ok()) << s1;
    EXPECT_EQ(w0, (std::vector<float>{0, 1, 2, 3}));  // lr 1, the mean gradient 1
    EXPECT_EQ(w1, w0);
  }

  // A typed stub's call of `method` with `token`: its status.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (pb::ParameterServer::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, const std::string& token) {
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    AttachToken(token, &ctx);
    Response response;
    return ((*stub).*method)(&ctx, request, &response);
  }

  // The same request on the socket data plane, on a connection whose hello carried `token`.
  absl::StatusOr<test::RawReply> CallPlane(DataMethod method, const google::protobuf::MessageLite& request,
                                           const std::string& token) {
    socket_plane::OwnedFd fd = test::RawConnect(server_->data_port());
    test::SendHello(fd.get(), "Bearer " + token);
    absl::StatusOr<test::RawReply> hello = test::ReadReply(fd.get());
    if (!hello.ok()) return hello.status();
    if (hello->header.code != 0) return absl::InternalError("the hello was refused: " + hello->message);
    test::SendRequest(fd.get(), static_cast<uint32_t>(method), request.SerializeAsString());
    return test::ReadReply(fd.get());
  }

  static inline const std::vector<float> kInitial = {1, 2, 3, 4};
  std::unique_ptr<server::SummaServer> server_;
  std::string address_;
  std::unique_ptr<worker::ParameterClient> zero_, one_;
};

// Rank 0's token cannot take rank 1 (a newer Join would fence rank 1's process): the Join is
// refused naming both ranks, and rank 1's holder goes on with its session.
TEST_F(ScopedTokenTest, AJoinAsAnotherRankIsRefusedAndItsHolderKeepsItsSession) {
  std::unique_ptr<worker::ParameterClient> thief = Member("zero-token");
  absl::StatusOr<worker::JoinInfo> joined = thief->Join(1, 2, Specs(), nullptr, "");
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kPermissionDenied) << joined.status();
  EXPECT_EQ(joined.status().message(),
            absl::StrCat("join ", address_, " as rank 1 failed after 1 attempts: ", kDenied));
  pb::JoinRequest join;
  join.set_rank(1);
  join.set_world_size(2);
  grpc::Status denied = Call(&pb::ParameterServer::Stub::Join, join, "zero-token");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message(), kDenied);
  for (const server::MemberInfo& m : server_->core().Status().members) {
    EXPECT_EQ(m.joins, 1) << "rank " << m.rank << " joined again";
  }
  EXPECT_TRUE(one_->Heartbeat(1).ok());
  BothStep();
}

// Every member call that names a rank, with rank 0's token as rank 1: refused with the same
// message on gRPC and on the socket plane, before the core sees it (nothing pushed, rank 1 not
// made to leave, its session whole). Calls for the whole job are refused to a scoped token.
TEST_F(ScopedTokenTest, EveryMemberCallAsAnotherRankIsRefusedOnGrpcAndTheSocketPlane) {
  pb::HeartbeatRequest heartbeat;
  heartbeat.set_rank(1);
  pb::LeaveRequest leave;
  leave.set_rank(1);
  pb::RollBackRequest roll_back;
  roll_back.set_rank(1);
  pb::InitializeRequest initialize;
  initialize.set_rank(1);
  initialize.set_dtype(pb::DTYPE_FLOAT32);
  initialize.set_data(std::string(16, '\0'));
  pb::PushRequest push;
  push.set_rank(1);
  push.set_dtype(pb::DTYPE_FLOAT32);
  push.set_num_examples(1);
  push.set_data(std::string(16, '\0'));
  pb::PullRequest pull;
  pull.set_rank(1);
  pb::AllReduceRequest member_sum;
  member_sum.set_name("sum");
  member_sum.set_rank(1);
  member_sum.set_members(true);
  SpecToProto({"t", DType::kFloat32, {1}}, member_sum.mutable_tensor());
  member_sum.mutable_tensor()->set_data(std::string(4, '\0'));
  pb::AllReduceRequest group_sum = member_sum;  // a fixed group's rank 1 of 2
  group_sum.set_members(false);
  group_sum.set_group_size(2);

  using Stub = pb::ParameterServer::Stub;
  const std::vector<std::pair<std::string, grpc::Status>> grpc_calls = {
      {"Heartbeat", Call(&Stub::Heartbeat, heartbeat, "zero-token")},
      {"Leave", Call(&Stub::Leave, leave, "zero-token")},
      {"RollBack", Call(&Stub::RollBack, roll_back, "zero-token")},
      {"Initialize", Call(&Stub::Initialize, initialize, "zero-token")},
      {"Push", Call(&Stub::Push, push, "zero-token")},
      {"Pull", Call(&Stub::Pull, pull, "zero-token")},
      {"PushPull", Call(&Stub::PushPull, push, "zero-token")},
      {"member AllReduce", Call(&Stub::AllReduce, member_sum, "zero-token")},
      {"fixed-group AllReduce", Call(&Stub::AllReduce, group_sum, "zero-token")},
  };
  for (const auto& [what, status] : grpc_calls) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << what << ": " << status.error_message();
    EXPECT_EQ(status.error_message(), kDenied) << what;
  }
  const std::vector<std::pair<DataMethod, const google::protobuf::MessageLite*>> plane_calls = {
      {DataMethod::kInitialize, &initialize}, {DataMethod::kPush, &push}, {DataMethod::kPull, &pull},
      {DataMethod::kPushPull, &push},         {DataMethod::kAllReduce, &member_sum},
      {DataMethod::kAllReduce, &group_sum}};
  for (const auto& [method, request] : plane_calls) {
    absl::StatusOr<test::RawReply> reply = CallPlane(method, *request, "zero-token");
    ASSERT_TRUE(reply.ok()) << DataMethodName(method) << ": " << reply.status();
    EXPECT_EQ(reply->header.code, static_cast<uint32_t>(grpc::StatusCode::PERMISSION_DENIED))
        << DataMethodName(method) << ": " << reply->message;
    EXPECT_EQ(reply->message, kDenied) << DataMethodName(method);
  }

  // For the whole job: an operator's pull (rank -1), shard coordination.
  pb::PullRequest operators_pull;
  operators_pull.set_rank(-1);
  grpc::Status whole = Call(&Stub::Pull, operators_pull, "zero-token");
  EXPECT_EQ(whole.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(whole.error_message(), "Pull for rank -1 (no member's: an operator's) acts for the whole job: this token "
                                   "is rank 0's (--token_file); use a bare token");
  absl::StatusOr<test::RawReply> plane_pull = CallPlane(DataMethod::kPull, operators_pull, "zero-token");
  ASSERT_TRUE(plane_pull.ok()) << plane_pull.status();
  EXPECT_EQ(plane_pull->message, whole.error_message());
  pb::ShardReport report;
  report.set_shard(1);
  report.set_shards(2);
  grpc::Status follow = Call(&Stub::Follow, report, "zero-token");
  EXPECT_EQ(follow.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(follow.error_message(), "Follow acts for the whole job: this token is rank 0's (--token_file); use a bare token");
  // The bare token and the admin's act for the whole job: past the authorization, the call
  // itself answers (an operator's pull of version 0; this server is not shard 0 of several).
  EXPECT_TRUE(Call(&Stub::Pull, operators_pull, "bare-token").ok());
  EXPECT_TRUE(Call(&Stub::Pull, operators_pull, "admin-token").ok());
  EXPECT_EQ(Call(&Stub::Follow, report, "bare-token").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A rank's own calls pass the scope (rank 1's heartbeat without its session: the core's refusal).
  const grpc::Status own = Call(&Stub::Heartbeat, heartbeat, "one-token");
  EXPECT_NE(own.error_code(), grpc::StatusCode::PERMISSION_DENIED) << own.error_message();
  EXPECT_NE(own.error_code(), grpc::StatusCode::UNAUTHENTICATED) << own.error_message();
  // The admin role stays the admin token's.
  grpc::Status checkpoint = Call(&Stub::Checkpoint, pb::CheckpointRequest(), "zero-token");
  EXPECT_EQ(checkpoint.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(checkpoint.error_message(), "an admin call needs the admin token (--admin_token_file), not a worker's");

  // Nothing of it reached the core: no push, no leave, no contribution, no second session.
  const server::StatusSnapshot status = server_->core().Status();
  EXPECT_EQ(status.pushes_served, 0u);
  ASSERT_EQ(status.members.size(), 2u);
  for (const server::MemberInfo& m : status.members) EXPECT_EQ(m.state, server::MemberState::kAlive) << m.rank;
  EXPECT_TRUE(one_->Heartbeat(1).ok());
  BothStep();
}

namespace health = ::grpc::health::v1;

// A plaintext health Check: the status's code, and the serving status when it is OK.
std::pair<grpc::StatusCode, health::HealthCheckResponse::ServingStatus> PlainCheck(
    const std::string& address, const std::string& service = "") {
  auto stub = health::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  health::HealthCheckRequest request;
  request.set_service(service);
  health::HealthCheckResponse response;
  grpc::Status s = stub->Check(&ctx, request, &response);
  return {s.error_code(), response.status()};
}

// Any method by name, plaintext, with an empty message: its status code.
grpc::StatusCode PlainCallByName(const std::string& address, const std::string& method) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;  // a default ByteBuffer is no message at all
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status.error_code();
}

TEST_F(SecurityTest, PlaintextHealthPortAnswersWhileTheMainPortNeedsTls) {
  Start(/*mutual=*/true, /*status_needs_token=*/true, "127.0.0.1:0");
  ASSERT_NE(server_->health_port(), 0);
  ASSERT_NE(server_->health_port(), server_->port());
  const std::string health_address = "127.0.0.1:" + std::to_string(server_->health_port());
  using Serving = health::HealthCheckResponse;
  EXPECT_EQ(PlainCheck(health_address), std::make_pair(grpc::StatusCode::OK, Serving::SERVING));
  EXPECT_EQ(PlainCheck(health_address, "summa.v1.ParameterServer"),
            std::make_pair(grpc::StatusCode::OK, Serving::SERVING));
  EXPECT_EQ(PlainCheck(health_address, "no.such.Service").first, grpc::StatusCode::NOT_FOUND);
  // The main port still speaks only mutual TLS, and the health port serves nothing else.
  EXPECT_EQ(PlainCheck(address_).first, grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(JoinWith(Client(/*with_cert=*/true, "worker.token")).ok());
  EXPECT_EQ(PlainCallByName(health_address, "/summa.v1.ParameterServer/GetStatus"), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(PlainCallByName(health_address, "/summa.v1.ParameterServer/Pull"), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(PlainCallByName(health_address, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            grpc::StatusCode::UNIMPLEMENTED);
  // After Shutdown a probe sees the server gone: NOT_SERVING while it stops, then no answer.
  server_->Shutdown();
  const auto after = PlainCheck(health_address);
  EXPECT_TRUE(after.first == grpc::StatusCode::UNAVAILABLE ||
              (after.first == grpc::StatusCode::OK && after.second == Serving::NOT_SERVING))
      << "code " << after.first << ", serving status " << after.second;
}

TEST(HealthOnlyServerTest, FollowsItsLeaderAndServesNothingElse) {
  absl::StatusOr<RunningServer> leader = StartGrpcServer("127.0.0.1:0", {}, {"summa.v1.Worker"});
  ASSERT_TRUE(leader.ok()) << leader.status();
  absl::StatusOr<RunningServer> follower = StartHealthOnlyServer("127.0.0.1:0", leader->health.get());
  ASSERT_TRUE(follower.ok()) << follower.status();
  const std::string leader_address = "127.0.0.1:" + std::to_string(leader->port);
  const std::string address = "127.0.0.1:" + std::to_string(follower->port);
  using Serving = health::HealthCheckResponse;
  EXPECT_EQ(PlainCheck(address, "summa.v1.Worker"), std::make_pair(grpc::StatusCode::OK, Serving::SERVING));
  leader->health->SetServing(false);
  EXPECT_EQ(PlainCheck(address, "summa.v1.Worker"), std::make_pair(grpc::StatusCode::OK, Serving::NOT_SERVING));
  EXPECT_EQ(PlainCheck(address), std::make_pair(grpc::StatusCode::OK, Serving::NOT_SERVING));
  leader->health->SetServing(true);
  EXPECT_EQ(PlainCheck(address), std::make_pair(grpc::StatusCode::OK, Serving::SERVING));
  // Reflection: served beside the leader's services, not on the health-only port.
  const std::string reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_NE(PlainCallByName(leader_address, reflection), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(PlainCallByName(address, reflection), grpc::StatusCode::UNIMPLEMENTED);
  // Only room for a service name: a large request is refused before the service sees it.
  EXPECT_EQ(PlainCheck(address, std::string(2 * kHealthMaxMessageBytes, 'x')).first,
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Names a port that is taken.
  absl::StatusOr<RunningServer> taken = StartHealthOnlyServer(address, leader->health.get());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  follower->server->Shutdown();
  leader->server->Shutdown();
}

// Watch sends the status and each change of it, and holds a server thread per stream: at most
// HealthService::kMaxWatches at once, and a stream the client cancelled lets go of its own.
TEST(HealthServiceTest, WatchSendsEachChangeAndAtMostSixteenAtOnce) {
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1:0", {}, {"summa.v1.Worker"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = health::Health::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port),
                                                          grpc::InsecureChannelCredentials()));
  using Serving = health::HealthCheckResponse;
  struct Watch {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<Serving>> reader;
  };
  auto watch = [&](const std::string& service) {
    auto w = std::make_unique<Watch>();
    w->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    health::HealthCheckRequest request;
    request.set_service(service);
    w->reader = stub->Watch(&w->ctx, request);
    return w;
  };
  auto next = [](Watch& w) {
    Serving r;
    return w.reader->Read(&r) ? r.status() : Serving::UNKNOWN;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  watches.push_back(watch("summa.v1.Worker"));
  EXPECT_EQ(next(*watches[0]), Serving::SERVING);
  server->health->SetServing(false);
  EXPECT_EQ(next(*watches[0]), Serving::NOT_SERVING);
  server->health->SetServing(true);
  EXPECT_EQ(next(*watches[0]), Serving::SERVING);
  watches.push_back(watch("no.such.Service"));
  EXPECT_EQ(next(*watches[1]), Serving::SERVICE_UNKNOWN);
  while (watches.size() < HealthService::kMaxWatches) {
    watches.push_back(watch(""));
    EXPECT_EQ(next(*watches.back()), Serving::SERVING);
  }
  // One more is refused; once one of the others is cancelled, a new one is served.
  std::unique_ptr<Watch> refused = watch("");
  EXPECT_EQ(next(*refused), Serving::UNKNOWN);
  EXPECT_EQ(refused->reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  watches[0]->ctx.TryCancel();
  bool served = false;
  for (int attempt = 0; attempt < 200 && !served; ++attempt) {
    std::unique_ptr<Watch> w = watch("");
    served = next(*w) == Serving::SERVING;
    w->ctx.TryCancel();
    if (!served) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(served);
  for (auto& w : watches) w->ctx.TryCancel();
  server->server->Shutdown();
}

TEST(TransportTest, TokensCompareWholeAndFlagsAreChecked) {
  const TokenCheck tokens("abc", "", false);
  EXPECT_TRUE(tokens.Check("Bearer abc", Role::kWorker).ok());
  EXPECT_EQ(tokens.Check("Bearer abd", Role::kWorker).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(tokens.Check("Bearer abcd", Role::kWorker).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(tokens.Check("Bearer ab", Role::kWorker).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(tokens.Check("Bearer ", Role::kWorker).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ValidateTls({"a.pem", "", ""}, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTls({"", "", "ca.pem"}, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTls({"", "", ""}, false).code(), absl::StatusCode::kOk);
  EXPECT_EQ(ValidateTls({"c.pem", "k.pem", ""}, false).code(), absl::StatusCode::kInvalidArgument);  // no CA
  EXPECT_EQ(ValidateTls({"", "", "/nonexistent/ca.pem"}, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckMetricsAddress("0.0.0.0:9100", {"c", "k", ""}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckMetricsAddress("127.0.0.1:9100", {"c", "k", ""}).ok());
  EXPECT_TRUE(CheckMetricsAddress("0.0.0.0:9100", {}).ok());
  const std::string empty = ::testing::TempDir() + "/empty.token";
  std::ofstream(empty) << "  \n";
  EXPECT_EQ(ReadTokenFile(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace summa
