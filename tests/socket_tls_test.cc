// TLS on the socket data plane (common/rpc/socket_tls.h, server/rpc/socket_plane.h): a daemon with
// --tls_cert and --data_address serves the plane in TLS 1.3 with the gRPC port's certificates and
// mutual-TLS rule; its TLS clients find it and use it; a plaintext client, a client certificate
// from another CA, a client without one where one is required, and a server certificate the
// client cannot verify are each refused, naming why; and a job through the TLS plane ends on the
// same weights, bit for bit, as through the plaintext one.
#include "common/rpc/socket_tls.h"

#include <poll.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/rpc/socket_frame.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/server_fixture.h"
#include "tests/socket_frames.h"
#include "tests/test_certs.h"

namespace summa {
namespace {

using test::MakeCerts;
using test::ReadTrimmed;

class TlsPlaneTest : public ServerFixture {
 protected:
  void SetUp() override {
    certs_ = MakeCerts("main");
    plane_ = worker::DataPlane::kSocket;
  }

  // A TLS server (mutual: it asks for client certificates signed by the CA) with a worker token,
  // serving the plane; the clients hold the CA, a client certificate and the token.
  void StartTls(bool mutual, int workers = 1, int64_t partition_bytes = 4 << 20) {
    security_.tls = {certs_ + "/server.pem", certs_ + "/server.key", mutual ? certs_ + "/ca.pem" : ""};
    token_ = ReadTrimmed(certs_ + "/worker.token");
    security_.tokens = TokenCheck(token_, ReadTrimmed(certs_ + "/admin.token"), false);
    client_tls_ = {certs_ + "/client.pem", certs_ + "/client.key", certs_ + "/ca.pem"};
    StartServer(workers, partition_bytes);
    ASSERT_NE(server_->data_port(), 0);
  }

  // A TLS connection to the plane as `files` make it, its hello sent with the worker token: the
  // hello's answer (OK when the plane admits it), or why the handshake or the hello failed.
  absl::Status HelloOverTls(const TlsFiles& files, const std::string& host = "127.0.0.1") {
    absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> context =
        socket_plane::TlsContext::Create(files, /*server=*/false);
    if (!context.ok()) return context.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    socket_plane::Link link(test::RawConnect(server_->data_port()));
    SUMMA_RETURN_IF_ERROR(link.StartTls(**context, host, deadline));
    const std::string authorization = "Bearer " + token_;
    char hello[socket_plane::kHelloBytes];
    socket_plane::EncodeHello(static_cast<uint32_t>(authorization.size()), hello);
    iovec iov[2] = {{hello, sizeof(hello)}, {const_cast<char*>(authorization.data()), authorization.size()}};
    SUMMA_RETURN_IF_ERROR(link.WriteFull(iov, 2, deadline, "the hello"));
    char head[socket_plane::kHeaderBytes];
    SUMMA_RETURN_IF_ERROR(link.ReadFull(head, sizeof(head), deadline, "the hello's answer"));
    const socket_plane::ReplyHeader answer = socket_plane::DecodeReplyHeader(head);
    return absl::Status(static_cast<absl::StatusCode>(answer.code), "the hello's answer");
  }

  // Two workers through the plane for `steps` sync steps of gradients that differ by rank, step
  // and element, over partitions of 64 KiB (so that replies run to many TLS records): rank 0's
  // weights after each step, all concatenated.
  std::vector<float> TwoWorkerJob(int steps) {
    constexpr int kValues = 300'000;
    const std::vector<TensorSpec> specs = {{"w", DType::kFloat32, {kValues}}};
    std::vector<float> initial(kValues);
    for (int i = 0; i < kValues; ++i) initial[i] = std::sin(0.001f * static_cast<float>(i));
    std::unique_ptr<worker::ParameterClient> zero = Client(1), one = Client(1);
    EXPECT_TRUE(zero->Join(0, 2, specs, initial.data(), "").ok());
    EXPECT_TRUE(one->Join(1, 2, specs, nullptr, "").ok());
    std::vector<float> trace;
    auto run = [&](worker::ParameterClient* client, int rank, std::vector<float>* out) {
      std::vector<float> grad(kValues), w(kValues);
      std::vector<int> live;
      for (int step = 0; step < steps; ++step) {
        for (int i = 0; i < kValues; ++i) grad[i] = std::cos(0.37f * static_cast<float>(i + 1000 * step + 7 * rank));
        const absl::Status s = client->PushPull(step, 3 + rank, grad.data(), w.data(), &live).status();
        EXPECT_TRUE(s.ok()) << s;
        if (out != nullptr) out->insert(out->end(), w.begin(), w.end());
      }
    };
    std::thread other([&] { run(one.get(), 1, nullptr); });
    run(zero.get(), 0, &trace);
    other.join();
    EXPECT_TRUE(zero->on_socket_plane());
    EXPECT_TRUE(one->on_socket_plane());
    return trace;
  }

  std::string certs_;
};

TEST_F(TlsPlaneTest, ATlsClientTakesTheTlsPlaneByItself) {
  StartTls(/*mutual=*/true);
  plane_ = worker::DataPlane::kAuto;
  std::unique_ptr<worker::ParameterClient> client = Client(1);
  worker::Collective group;
  group.name = "alone";
  group.group_size = 1;
  std::vector<float> values = {1, 2, 3};
  ASSERT_TRUE(client->AllReduceInto(group, values, absl::MakeSpan(values)).ok());
  EXPECT_TRUE(client->on_socket_plane());
  EXPECT_EQ(values, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Status().allreduce_rounds(), 1u);
}

TEST_F(TlsPlaneTest, AJobThroughTheTlsPlaneEndsOnThePlaintextPlanesWeightsBitForBit) {
  StartServer(2, 64 << 10);  // plaintext first
  const std::vector<float> plaintext = TwoWorkerJob(4);
  server_.reset();
  StartTls(/*mutual=*/true, 2, 64 << 10);
  const std::vector<float> tls = TwoWorkerJob(4);
  ASSERT_EQ(tls.size(), plaintext.size());
  ASSERT_FALSE(tls.empty());
  EXPECT_EQ(std::memcmp(tls.data(), plaintext.data(), tls.size() * sizeof(float)), 0);
  EXPECT_EQ(Status().version(), 4u);
}

TEST_F(TlsPlaneTest, APlaintextClientIsToldThePlaneSpeaksTls) {
  StartTls(/*mutual=*/false);
  socket_plane::OwnedFd fd = test::RawConnect(server_->data_port());
  test::SendHello(fd.get(), "Bearer " + token_);
  absl::StatusOr<test::RawReply> reply = test::ReadReply(fd.get());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(reply->message, "speaks TLS 1.3")) << reply->message;
  EXPECT_TRUE(test::ClosedByServer(fd.get()));
}

TEST_F(TlsPlaneTest, TheHelloAndItsTokenAreCheckedInsideTheTunnel) {
  StartTls(/*mutual=*/false);
  EXPECT_TRUE(HelloOverTls(client_tls_).ok());
  token_ = "not-the-token";
  EXPECT_EQ(HelloOverTls(client_tls_).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsPlaneTest, AClientCertificateFromAnotherCaOrNoneIsRefusedWhereTheServerAsksForOne) {
  StartTls(/*mutual=*/true);
  EXPECT_TRUE(HelloOverTls(client_tls_).ok());
  const std::string other = MakeCerts("other");
  const absl::Status foreign = HelloOverTls({other + "/client.pem", other + "/client.key", certs_ + "/ca.pem"});
  EXPECT_EQ(foreign.code(), absl::StatusCode::kUnauthenticated) << foreign;
  EXPECT_TRUE(absl::StrContains(foreign.message(), "unknown ca")) << foreign;
  const absl::Status none = HelloOverTls({"", "", certs_ + "/ca.pem"});
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "certificate required")) << none;
}

TEST_F(TlsPlaneTest, AServerCertificateTheClientCannotVerifyIsRefused) {
  StartTls(/*mutual=*/false);
  const std::string other = MakeCerts("other");
  const absl::Status untrusted = HelloOverTls({"", "", other + "/ca.pem"});
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kUnauthenticated) << untrusted;
  EXPECT_TRUE(absl::StrContains(untrusted.message(), "certificate verify failed")) << untrusted;
  // The right CA, but a host the certificate does not name.
  const absl::Status elsewhere = HelloOverTls({"", "", certs_ + "/ca.pem"}, "summa-elsewhere.example");
  EXPECT_EQ(elsewhere.code(), absl::StatusCode::kUnauthenticated) << elsewhere;
  EXPECT_TRUE(absl::StrContains(elsewhere.message(), "hostname mismatch")) << elsewhere;
  // ... or an address it does not name (the connection still goes to 127.0.0.1).
  const absl::Status other_ip = HelloOverTls({"", "", certs_ + "/ca.pem"}, "127.0.0.2");
  EXPECT_EQ(other_ip.code(), absl::StatusCode::kUnauthenticated) << other_ip;
  EXPECT_TRUE(absl::StrContains(other_ip.message(), "IP address mismatch")) << other_ip;
  EXPECT_TRUE(HelloOverTls({"", "", certs_ + "/ca.pem"}, "localhost").ok());
}

TEST_F(TlsPlaneTest, ACaFileHoldingAnIntermediateIssuerIsTrustedAsGrpcTrustsIt) {
  // A root, an issuer it signs (a cert-manager issuer, say), and the server's certificate from
  // the issuer; the client trusts the issuer alone.
  const std::string dir = certs_ + "/chain";
  const std::string script = "set -e; mkdir -p " + dir + "; cd " + dir + R"(
    q() { "$@" 2>/dev/null; }
    q openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=root -keyout root.key -out root.pem
    q openssl req -newkey rsa:2048 -nodes -subj /CN=issuer -keyout issuer.key -out issuer.csr
    printf 'basicConstraints=critical,CA:true
keyUsage=critical,keyCertSign,cRLSign
' >ca.ext
    q openssl x509 -req -in issuer.csr -CA root.pem -CAkey root.key -CAcreateserial -days 2 -extfile ca.ext -out issuer.pem
    q openssl req -newkey rsa:2048 -nodes -subj /CN=summa-server -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth
' >server.ext
    q openssl x509 -req -in server.csr -CA issuer.pem -CAkey issuer.key -CAcreateserial -days 2 -extfile server.ext -out server.pem)";
  ASSERT_EQ(std::system(("bash -c '" + absl::StrReplaceAll(script, {{"'", "'\\''"}}) + "'").c_str()), 0);
  token_ = ReadTrimmed(certs_ + "/worker.token");
  security_.tls = {dir + "/server.pem", dir + "/server.key", ""};
  security_.tokens = TokenCheck(token_, "", false);
  StartServer(1, 4 << 20);
  const absl::Status trusted = HelloOverTls({"", "", dir + "/issuer.pem"});
  EXPECT_TRUE(trusted.ok()) << trusted;
  // A CA file with neither the issuer nor its root still fails.
  EXPECT_EQ(HelloOverTls({"", "", certs_ + "/ca.pem"}).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsPlaneTest, ARotatedCertificateIsServedToNewConnectionsWithoutARestart) {
  // The server's files are copies, so that the test can replace them as a renewal would.
  const std::string live = certs_ + "/live";
  std::filesystem::create_directories(live);
  auto install = [&](const std::string& from) {
    for (const char* name : {"server.pem", "server.key"}) {
      std::filesystem::copy_file(from + "/" + name, live + "/" + name + ".new",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(live + "/" + name + ".new", live + "/" + name);  // atomic, as kubelet's swap
    }
  };
  install(certs_);
  token_ = ReadTrimmed(certs_ + "/worker.token");
  security_.tls = {live + "/server.pem", live + "/server.key", ""};
  security_.tokens = TokenCheck(token_, "", false);
  StartServer(1, 4 << 20);
  const std::string renewed = MakeCerts("renewed");
  ASSERT_TRUE(HelloOverTls({"", "", certs_ + "/ca.pem"}).ok());
  install(renewed);
  // The files are looked at again kCertificateRefreshSeconds after the last look at most.
  absl::SleepFor(absl::Seconds(kCertificateRefreshSeconds) + absl::Milliseconds(200));
  const absl::Status old_ca = HelloOverTls({"", "", certs_ + "/ca.pem"});
  EXPECT_EQ(old_ca.code(), absl::StatusCode::kUnauthenticated) << old_ca;
  EXPECT_TRUE(absl::StrContains(old_ca.message(), "certificate verify failed")) << old_ca;
  EXPECT_TRUE(HelloOverTls({"", "", renewed + "/ca.pem"}).ok());
}

TEST_F(TlsPlaneTest, AContextFromFilesItCannotUseNamesTheFlag) {
  absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> swapped = socket_plane::TlsContext::Create(
      {certs_ + "/server.pem", certs_ + "/client.key", ""}, /*server=*/true);
  ASSERT_FALSE(swapped.ok());
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(swapped.status().message(), "--tls_key")) << swapped.status();
  EXPECT_TRUE(absl::StrContains(swapped.status().message(), "key values mismatch")) << swapped.status();
  absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> not_pem = socket_plane::TlsContext::Create(
      {certs_ + "/worker.token", certs_ + "/server.key", ""}, /*server=*/true);
  ASSERT_FALSE(not_pem.ok());
  EXPECT_TRUE(absl::StrContains(not_pem.status().message(), "--tls_cert")) << not_pem.status();
}

}  // namespace
}  // namespace summa
