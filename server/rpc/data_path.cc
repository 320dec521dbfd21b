#include "server/rpc/data_path.h"

#include <atomic>
#include <memory>

namespace summa::server {
namespace {

using Method = DataMethod;

// One call of one method: asked of gRPC, served when it arrives, freed when gRPC is done with
// it. Each event comes back on the queue with a tag of its own: the call's arrival (or, once the
// server shut down, the news that it never will), its answer sent, and its end (gRPC's
// AsyncNotifyWhenDone: when the call is over, answered or cancelled by the client). A call that
// arrived is freed after both of the last two.
class AsyncCall final : public DataCall {
 public:
  enum class Event { kArrived, kAnswered, kDone };
  struct Tag {
    AsyncCall* call;
    Event event;
  };

  AsyncCall(ParameterServerService* service, grpc::ServerCompletionQueue* queue, DataPath* path, Method method)
      : service_(service), queue_(queue), path_(path), method_(method), writer_(&context_) {
    context_.AsyncNotifyWhenDone(&done_);
  }

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
        case Method::kSparsePull:
          service_->RequestSparsePull(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
        case Method::kSparsePush:
          service_->RequestSparsePush(&context_, &request_, &writer_, queue_, queue_, &arrived_);
          break;
      }
    });
    if (!started) delete this;
  }

  // What the queue returned for this call.
  void On(Event event, bool ok) {
    switch (event) {
      case Event::kArrived:
        // A call that never arrived (the server shut down) has nothing else to come.
        if (!ok) {
          delete this;
          return;
        }
        (new AsyncCall(service_, queue_, path_, method_))->Request();  // in its place
        return Serve();
      case Event::kAnswered:
        return Release();
      case Event::kDone:
        // The client went away: a call parked in the core is answered now (CANCELLED), not at
        // its step's end or its deadline.
        if (context_.IsCancelled()) OnCancelled();
        return Release();
    }
  }

  std::string peer() const override { return context_.peer(); }
  absl::StatusOr<Caller> Identify(const TokenCheck& tokens, Role role) const override {
    return tokens.Identify(context_, role);
  }
  const grpc::ByteBuffer& request() const override { return request_; }
  grpc::ByteBuffer* response() override { return &response_; }
  void Answer(const grpc::Status& status) override {
    // Once the queue is shut down nothing can be sent: the answer counts as sent.
    if (!path_->StartOp([&] { writer_.Finish(response_, status, &answered_); })) Release();
  }

 private:
  void Serve() { service_->ServeData(method_, this); }
  void Release() {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  ParameterServerService* const service_;
  grpc::ServerCompletionQueue* const queue_;
  DataPath* const path_;
  const Method method_;
  grpc::ServerContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_;
  std::atomic<int> pending_{2};  // of kAnswered and kDone, once the call arrived
  Tag arrived_{this, Event::kArrived};
  Tag answered_{this, Event::kAnswered};
  Tag done_{this, Event::kDone};
};

}  // namespace

DataPath::DataPath(ParameterServerService* service, grpc::ServerCompletionQueue* queue, int threads)
    : service_(service), queue_(queue) {
  for (Method m : kDataMethods) {
    for (int i = 0; i < kRequestsAhead; ++i) (new AsyncCall(service_, queue_, this, m))->Request();
  }
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Poll(); });
}

void DataPath::Poll() {
  void* tag;
  bool ok;
  while (queue_->Next(&tag, &ok)) {
    auto* t = static_cast<AsyncCall::Tag*>(tag);
    t->call->On(t->event, ok);
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
