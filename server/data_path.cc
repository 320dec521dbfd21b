#include "server/data_path.h"

#include <memory>

namespace summa::server {
namespace {

enum class Method { kInitialize, kPush, kPull, kPushPull, kAllReduce };

// One call of one method: asked of gRPC, served when it arrives, freed when its answer has been
// sent (or when it never arrived: the server shut down). Each of the two events comes back on
// the queue with a tag of its own.
class AsyncCall final : public DataCall {
 public:
  struct Tag {
    AsyncCall* call;
    bool answered;  // false: the call arrived; true: its answer went out
  };

  AsyncCall(ParameterServerService* service, grpc::ServerCompletionQueue* queue, DataPath* path, Method method)
      : service_(service), queue_(queue), path_(path), method_(method), writer_(&context_) {}

  // Asks gRPC for the method's next call; deletes this call when the queue is shut down.
  void Request() {
    const bool started = path_->StartOp([this] {
      switch (method_) {
        case Method::kInitialize:
          service_->RequestInitialize(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
        case Method::kPush:
          service_->RequestPush(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
        case Method::kPull:
          service_->RequestPull(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
        case Method::kPushPull:
          service_->RequestPushPull(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
        case Method::kAllReduce:
          service_->RequestAllReduce(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
      }
    });
    if (!started) delete this;
  }

  // The call arrived: another is asked for in its place, then this one is served.
  void Arrived() {
    (new AsyncCall(service_, queue_, path_, method_))->Request();
    switch (method_) {
      case Method::kInitialize: return service_->ServeInitialize(this);
      case Method::kPush: return service_->ServePush(this);
      case Method::kPull: return service_->ServePull(this);
      case Method::kPushPull: return service_->ServePushPull(this);
      case Method::kAllReduce: return service_->ServeAllReduce(this);
    }
  }

  const grpc::ServerContextBase& context() const override { return context_; }
  const grpc::ByteBuffer& request() const override { return request_; }
  grpc::ByteBuffer* response() override { return &response_; }
  void Answer(const grpc::Status& status) override {
    // Once the queue is shut down (every call was answered before: see DataPath), nothing can
    // be sent: the call is freed.
    if (!path_->StartOp([&] { writer_.Finish(response_, status, &answered_); })) delete this;
  }

 private:
  ParameterServerService* const service_;
  grpc::ServerCompletionQueue* const queue_;
  DataPath* const path_;
  const Method method_;
  grpc::ServerContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_;
  Tag arrived_{this, false};
  Tag answered_{this, true};
};

}  // namespace

DataPath::DataPath(ParameterServerService* service, grpc::ServerCompletionQueue* queue, int threads)
    : service_(service), queue_(queue) {
  for (Method m : {Method::kInitialize, Method::kPush, Method::kPull, Method::kPushPull, Method::kAllReduce}) {
    for (int i = 0; i < kRequestsAhead; ++i) (new AsyncCall(service_, queue_, this, m))->Request();
  }
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Poll(); });
}

void DataPath::Poll() {
  void* tag;
  bool ok;
  while (queue_->Next(&tag, &ok)) {
    auto* t = static_cast<AsyncCall::Tag*>(tag);
    // An answer sent (or not: the client went away), or a call asked for that will never come
    // (the server shut down): done with.
    if (t->answered || !ok) {
      delete t->call;
      continue;
    }
    t->call->Arrived();
  }
}

void DataPath::Stop() {
  {
    absl::WriterMutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  queue_->Shutdown();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace summa::server
