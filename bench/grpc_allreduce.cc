#include "bench/grpc_allreduce.h"

#include <grpcpp/generic/async_generic_service.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/rpc/grpc_status.h"
#include "common/vector_ops.h"

namespace summa::bench {
namespace {

constexpr char kMethod[] = "/summa.bench.GrpcFloor/AllReduce";

// Copies a message's bytes into `out` when it holds exactly out.size() bytes.
absl::Status CopyOut(const grpc::ByteBuffer& message, std::vector<grpc::Slice>& slices, char* out,
                     size_t bytes) {
  if (message.Length() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message of ", message.Length(), " bytes where ", bytes, " were expected"));
  }
  slices.clear();
  if (grpc::Status s = message.Dump(&slices); !s.ok()) return FromGrpcStatus(s);
  for (const grpc::Slice& slice : slices) {
    std::memcpy(out, slice.begin(), slice.size());
    out += slice.size();
  }
  return absl::OkStatus();
}

// One polling thread serves every call, so nothing here needs a lock.
class Server {
 public:
  Server(int group_size, int64_t bytes)
      : group_size_(group_size), bytes_(static_cast<size_t>(bytes)), sum_(bytes_ / 4), incoming_(bytes_ / 4) {}

  absl::StatusOr<int> Start() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterAsyncGenericService(&service_);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    queue_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) return absl::UnavailableError("gRPC server: cannot listen on 127.0.0.1:0");
    Accept();
    thread_ = std::thread([this] { Poll(); });
    return port;
  }

  // Ends every call and the polling thread. The poller starts no operation once stopping (one
  // started on a queue that is shutting down aborts the process), and the queue is shut down
  // after the server, which cancels every call first.
  void Stop() {
    stopping_ = true;
    server_->Shutdown(std::chrono::system_clock::now());
    queue_->Shutdown();
    thread_.join();
  }

 private:
  struct Call {
    enum State { kAccepting, kReading, kAnswering };
    grpc::GenericServerContext context;
    grpc::GenericServerAsyncReaderWriter stream{&context};
    grpc::ByteBuffer request;
    State state = kAccepting;
  };

  void Accept() {
    auto* call = new Call;
    service_.RequestCall(&call->context, &call->stream, queue_.get(), queue_.get(), call);
  }

  void Finish(Call* call, const absl::Status& status) {
    call->state = Call::kAnswering;
    call->stream.Finish(ToGrpcStatus(status), call);
  }

  void Poll() {
    void* tag;
    bool ok;
    while (queue_->Next(&tag, &ok)) {
      auto* call = static_cast<Call*>(tag);
      if (stopping_ && call->state != Call::kAnswering) {
        // Its operation failed with the shutdown; an answer already started still completes.
        delete call;
        continue;
      }
      switch (call->state) {
        case Call::kAccepting:
          if (!ok) {  // shutting down
            delete call;
            break;
          }
          Accept();
          call->state = Call::kReading;
          call->stream.Read(&call->request, call);
          break;
        case Call::kReading:
          if (!ok) {
            Finish(call, absl::InvalidArgumentError("the call carried no tensor"));
            break;
          }
          Contribute(call);
          break;
        case Call::kAnswering:
          delete call;
          break;
      }
    }
  }

  void Contribute(Call* call) {
    float* into = waiting_.empty() ? sum_.data() : incoming_.data();
    if (absl::Status s = CopyOut(call->request, slices_, reinterpret_cast<char*>(into), bytes_); !s.ok()) {
      Finish(call, s);
      return;
    }
    call->request.Clear();  // copied: the round holds no rank's message while it waits
    if (!waiting_.empty()) AddInto(absl::MakeSpan(sum_), incoming_);
    waiting_.push_back(call);
    if (static_cast<int>(waiting_.size()) < group_size_) return;
    // One copy of the sum, shared by every answer (gRPC holds a reference until each is sent).
    grpc::Slice sum(sum_.data(), bytes_);
    const grpc::ByteBuffer reply(&sum, 1);
    for (Call* c : waiting_) {
      c->state = Call::kAnswering;
      c->stream.WriteAndFinish(reply, grpc::WriteOptions(), grpc::Status::OK, c);
    }
    waiting_.clear();
  }

  const int group_size_;
  const size_t bytes_;
  std::vector<float> sum_;
  std::vector<float> incoming_;
  std::vector<grpc::Slice> slices_;
  std::vector<Call*> waiting_;
  std::atomic<bool> stopping_{false};
  grpc::AsyncGenericService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::unique_ptr<grpc::Server> server_;
  std::thread thread_;
};

}  // namespace

absl::Status RunGrpcServer(const RawServerOptions& options) {
  if (options.group_size < 1) return absl::InvalidArgumentError("gRPC server: the group needs a rank");
  if (options.bytes <= 0 || options.bytes % 4 != 0) {
    return absl::InvalidArgumentError("gRPC server: the size must be a positive multiple of 4 bytes");
  }
  Server server(options.group_size, options.bytes);
  absl::StatusOr<int> port = server.Start();
  if (!port.ok()) return port.status();
  absl::Status written = WriteFileAtomically(options.port_file, absl::StrCat(*port, "\n"));
  if (written.ok()) {
    // The driver reads this process's peak RSS once its ranks are done, then stops it.
    absl::SleepFor(options.timeout);
    written = absl::DeadlineExceededError("gRPC server: nobody stopped it within --timeout");
  }
  server.Stop();
  return written;
}

GrpcAllReduceClient::GrpcAllReduceClient(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
    : timeout_(timeout), channel_(std::move(channel)), stub_(channel_) {}

absl::StatusOr<std::unique_ptr<GrpcAllReduceClient>> GrpcAllReduceClient::Connect(const std::string& address,
                                                                                  absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::DeadlineExceededError(absl::StrCat("gRPC rank: no connection to ", address, " within ",
                                                    absl::FormatDuration(timeout)));
  }
  return std::unique_ptr<GrpcAllReduceClient>(new GrpcAllReduceClient(std::move(channel), timeout));
}

absl::Status GrpcAllReduceClient::AllReduce(const std::vector<float>& in, std::vector<float>& out) {
  const size_t bytes = in.size() * sizeof(float);
  // Borrowed, not copied: the call completes only after the server has read the whole message.
  // (A call cut off by its deadline may leave the transport holding it; the rank then exits.)
  grpc::Slice borrowed(in.data(), bytes, grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer request(&borrowed, 1);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  grpc::ByteBuffer reply;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub_.PrepareUnaryCall(&context, kMethod, request, &queue_);
  call->StartCall();
  call->Finish(&reply, &status, this);
  void* tag;
  bool ok;
  if (!queue_.Next(&tag, &ok)) return absl::InternalError("gRPC rank: the completion queue shut down");
  if (!status.ok()) {
    const absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat("gRPC rank: ", s.message()));
  }
  out.resize(in.size());
  return CopyOut(reply, slices_, reinterpret_cast<char*>(out.data()), bytes);
}

}  // namespace summa::bench
