#include "common/rpc/server_builder.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa {

namespace {

// Registers the health service and starts the server (its port into running.port), with
// kServerHandshakeTimeoutMs. Without SO_REUSEPORT, which gRPC sets by default: a second server
// started on a taken port fails to start instead of silently sharing the port's connections (and
// a probe port answering for whichever process the kernel picked).
absl::Status Start(grpc::ServerBuilder& builder, const std::string& address, RunningServer& running) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kServerHandshakeTimeoutMs);
  builder.RegisterService(running.health.get());
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (address in use or not a local address?)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& address,
                                              const std::vector<grpc::Service*>& services,
                                              const std::vector<std::string>& service_names,
                                              std::shared_ptr<grpc::ServerCredentials> credentials,
                                              int max_message_bytes, int completion_queues) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  RunningServer running;
  running.health = std::make_unique<HealthService>(service_names);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, std::move(credentials), &running.port);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  for (const auto& [name, value] : DataPathArguments()) builder.AddChannelArgument(name, value);
  for (grpc::Service* service : services) builder.RegisterService(service);
  for (int i = 0; i < completion_queues; ++i) running.queues.push_back(builder.AddCompletionQueue());
  SUMMA_RETURN_IF_ERROR(Start(builder, address, running));
  return running;
}

namespace {
// Drops the plugins every ServerBuilder gets from the process-wide list (server reflection, once
// StartGrpcServer has run), so that a builder serves only what it registers.
class WithoutPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};
}  // namespace

absl::StatusOr<RunningServer> StartHealthOnlyServer(const std::string& address, const HealthService* leader) {
  RunningServer running;
  running.health = std::make_unique<HealthService>(leader);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutPlugins>());
  // Anyone who reaches the port may call it, without TLS or a token: a health request is a
  // service name, so gRPC's 4 MB default would only be room for abuse.
  builder.SetMaxReceiveMessageSize(kHealthMaxMessageBytes);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &running.port);
  SUMMA_RETURN_IF_ERROR(Start(builder, address, running));
  return running;
}

std::vector<std::pair<std::string, int>> DataPathArguments() {
  return {{GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kMinReadChunkBytes},
          {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kMaxReadChunkBytes}};
}

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  for (const auto& [name, value] : DataPathArguments()) args.SetInt(name, value);
  return args;
}

}  // namespace summa
