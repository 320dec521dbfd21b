// ServerFixture: a summa-server daemon in this process on 127.0.0.1:0, serving the socket data
// plane beside gRPC, and worker ParameterClients of it; shared by ps_client_test.cc and
// socket_calls_test.cc.
#ifndef SUMMA_TESTS_SERVER_FIXTURE_H_
#define SUMMA_TESTS_SERVER_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/rpc/transport.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa {

namespace pb = ::summa::v1;

// A server in this process, and clients of it on `plane_`'s transport. The server serves the
// socket data plane unless `data_address_` is emptied first.
class ServerFixture : public ::testing::Test {
 protected:
  void StartServer(int workers, int64_t partition_bytes) {
    server::ServerOptions o;
    o.world_size = workers;
    o.optimizer.learning_rate = 0.5;
    o.partition_bytes = partition_bytes;
    o.barrier_deadline = absl::Seconds(20);
    if (configure_) configure_(o);
    auto s = server::SummaServer::Start("127.0.0.1:0", o, "", security_, "", {}, data_address_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<worker::ParameterClient> Client(int channels, absl::Duration deadline = absl::Seconds(20)) {
    auto client = std::make_unique<worker::ParameterClient>(address_, deadline, absl::Seconds(20), channels,
                                                            ClientSecurity{client_tls_, token_});
    client->set_data_plane(plane_);
    return client;
  }

  pb::ServerStatus Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AttachToken(token_, &ctx);
    pb::ServerStatus status;
    auto stub = pb::ParameterServer::NewStub(grpc::CreateChannel(address_, ChannelCredentialsFor(client_tls_)));
    EXPECT_TRUE(stub->GetStatus(&ctx, pb::GetStatusRequest(), &status).ok());
    return status;
  }

  std::unique_ptr<server::SummaServer> server_;
  std::string address_;
  std::function<void(server::ServerOptions&)> configure_;  // applied last by StartServer, when set
  std::string data_address_ = "127.0.0.1:0";
  EndpointSecurity security_;
  std::string token_;  // the clients'
  TlsFiles client_tls_;  // the clients' (none: plaintext)
  worker::DataPlane plane_ = worker::DataPlane::kGrpc;
};

}  // namespace summa

#endif  // SUMMA_TESTS_SERVER_FIXTURE_H_
