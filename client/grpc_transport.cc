#include "client/grpc_transport.h"

#include "common/rpc/grpc_status.h"
#include "common/rpc/transport.h"

namespace summa::worker {

GrpcTransport::GrpcTransport(std::vector<std::vector<grpc::GenericStub*>> channels, ClientToken token)
    : channels_(std::move(channels)), token_(std::move(token)), next_channel_(channels_.size(), 0) {}

GrpcTransport::~GrpcTransport() {
  queue_.Shutdown();
  void* tag;
  bool ok;
  while (queue_.Next(&tag, &ok)) {
  }
}

void GrpcTransport::Start(size_t tag, int shard, DataMethod method, const grpc::ByteBuffer* request,
                          grpc::ByteBuffer* reply, absl::Time deadline) {
  if (tag >= calls_.size()) calls_.resize(tag + 1);
  Call& c = calls_[tag];
  // A finished call's reader lives in its call's arena, which its context frees: the reader goes
  // first.
  c.reader.reset();
  c.context = std::make_unique<grpc::ClientContext>();
  c.context->set_deadline(absl::ToChronoTime(deadline));
  AttachToken(token_.Current(), c.context.get());
  c.status = grpc::Status();
  const std::vector<grpc::GenericStub*>& stubs = channels_[shard];
  grpc::GenericStub* stub = stubs[next_channel_[shard]++ % stubs.size()];
  c.reader = stub->PrepareUnaryCall(c.context.get(), DataMethodPath(method), *request, &queue_);
  c.reader->StartCall();
  c.reader->Finish(reply, &c.status, reinterpret_cast<void*>(tag));
  ++in_flight_;
}

namespace {
// The alarm's tag on the queue: no call's (calls' tags are their indexes).
void* const kWakeTag = reinterpret_cast<void*>(DataTransport::kWoken);
}  // namespace

void GrpcTransport::Wake() {
  if (!wake_set_.exchange(true)) wake_.Set(&queue_, gpr_now(GPR_CLOCK_MONOTONIC), kWakeTag);
}

bool GrpcTransport::Next(size_t* tag, absl::Status* status) {
  if (in_flight_ == 0) return false;
  void* t;
  bool ok;
  if (!queue_.Next(&t, &ok)) return false;
  if (t == kWakeTag) {
    wake_set_ = false;
    *tag = kWoken;
    *status = absl::OkStatus();
    return true;
  }
  --in_flight_;
  *tag = reinterpret_cast<size_t>(t);
  *status = FromGrpcStatus(calls_[*tag].status);
  return true;
}

}  // namespace summa::worker
