// The server core's request handlers (server/core/parameter_server.h) through their request views:
// a ParameterServer of a few small tensors, with options and a sequence of Join, Initialize,
// Push, Pull, PushPull, Heartbeat, Leave, Tick and Status chosen by the fuzz input, on a FakeClock
// (nothing sleeps). The checks: nothing crashes; every call is answered exactly once by the end
// (after Shutdown); a pull answered OK carries its partition's length at a version it asked for.
//
// The model is at most 3 tensors of at most 2 x 7 floats: the server allocates whatever a Join
// declares, and bounding that is a limit of its own (issue 11, part 4), not this harness's subject.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "common/clock.h"
#include "common/logging.h"
#include "common/partition_map.h"
#include "server/core/parameter_server.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "parameter_server_fuzzer: %s\n", what);
    std::abort();
  }
}

// A value in [0, most], or now and then any value of its type.
template <typename T>
T Small(FuzzedDataProvider& in, T most) {
  const T v = in.ConsumeIntegralInRange<T>(0, most + 1);
  return v == most + 1 ? in.ConsumeIntegral<T>() : v;
}

// `n` floats of the input's bytes, or (when the input says so) some other number of bytes.
std::string Values(FuzzedDataProvider& in, int64_t n, int bytes_per_value = 4) {
  const size_t bytes = in.ConsumeBool() ? n * bytes_per_value : in.ConsumeIntegralInRange<size_t>(0, n * 8 + 4);
  std::string v = in.ConsumeBytesAsString(bytes);
  return v;
}

struct Pending {
  std::shared_ptr<FakeCall> call;
  uint32_t partition;
  uint64_t min_version;  // what a pull asked for; 0 for a push-pull
};

class Session {
 public:
  explicit Session(FuzzedDataProvider& in) : in_(in) {}

  // False when the input chose options the daemon would refuse.
  bool Start() {
    ServerOptions o;
    o.require_sessions = false;  // the fuzzer drives ranks without sessions
    o.world_size = in_.ConsumeIntegralInRange(1, 3);
    o.mode = in_.PickValueInArray({Mode::kSync, Mode::kAsync, Mode::kSsp});
    o.staleness = in_.ConsumeIntegralInRange(0, 3);
    o.optimizer.name = in_.PickValueInArray({"sgd", "adam", "adamw"});
    o.optimizer.momentum = in_.ConsumeBool() ? 0.9 : 0.0;
    o.optimizer.nesterov = o.optimizer.momentum > 0 && in_.ConsumeBool();
    o.optimizer.weight_decay = in_.ConsumeBool() ? 0.01 : 0.0;
    o.optimizer.schedule = in_.PickValueInArray({LrSchedule::kConstant, LrSchedule::kStep, LrSchedule::kCosine});
    o.optimizer.step_size = in_.ConsumeIntegralInRange(1, 3);
    o.optimizer.warmup_steps = in_.ConsumeIntegralInRange(0, 3);
    o.optimizer.total_steps = in_.ConsumeIntegralInRange(0, 8);
    o.nonfinite = in_.PickValueInArray({NonFinite::kReject, NonFinite::kSkipStep, NonFinite::kZero});
    o.partition_bytes = 4 * in_.ConsumeIntegralInRange(1, 8);
    o.barrier_deadline = absl::Seconds(in_.ConsumeIntegralInRange(1, 30));
    o.lease = absl::Seconds(in_.ConsumeIntegralInRange(1, 10));
    o.on_worker_loss = in_.ConsumeBool() ? OnWorkerLoss::kShrink : OnWorkerLoss::kWait;
    o.rejoin_deadline = absl::Seconds(in_.ConsumeIntegralInRange(1, 60));
    o.clock = &clock_;
    if (!ValidateOptions(o).ok()) return false;
    const int tensors = in_.ConsumeIntegralInRange(1, 3);
    for (int t = 0; t < tensors; ++t) {
      TensorSpec spec{"w" + std::to_string(t), DType::kFloat32, {}};
      const int dims = in_.ConsumeIntegralInRange(0, 2);
      for (int d = 0; d < dims; ++d) spec.shape.push_back(in_.ConsumeIntegralInRange(1, 7));
      model_.push_back(spec);
    }
    absl::StatusOr<PartitionMap> map = PartitionMap::Create(model_, o.partition_bytes);
    Check(map.ok(), "the harness's model does not map");
    partitions_ = map->partitions();
    world_size_ = o.world_size;
    partition_bytes_ = o.partition_bytes;
    server_ = std::make_unique<ParameterServer>(std::move(o));
    return true;
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange(0, 9)) {
      case 0: Join(); break;
      case 1: Initialize(); break;
      case 2: server_->Push(PushView()).IgnoreError(); break;
      case 3: {
        const uint32_t partition = Partition();
        const uint64_t min_version = Small<uint64_t>(in_, 6);
        auto call = Track(partition, min_version);
        server_->Pull(Rank(), 0, partition, min_version, call);
        break;
      }
      case 4: {
        PushRequestView view = PushView();
        server_->PushPull(view, Track(view.partition, 0));
        break;
      }
      case 5: server_->Heartbeat(Rank(), 0).IgnoreError(); break;
      case 6: server_->Leave(Rank(), 0).IgnoreError(); break;
      case 7:
        clock_.Advance(absl::Seconds(in_.ConsumeIntegralInRange(0, 40)));
        server_->Tick(clock_.Now());
        break;
      case 8: {
        const StatusSnapshot s = server_->Status();
        Check(s.partitions_pending >= 0 && s.partitions_pending <= s.partition_count,
              "more partitions pending than there are");
        break;
      }
      default: server_->MaybeCheckpoint(in_.ConsumeBool()).IgnoreError(); break;  // no directory: a no-op
    }
  }

  // Every call answered exactly once (FakeCall aborts on a second answer), with what it asked for.
  void Finish() {
    server_->Shutdown();
    Learn();
    for (const Pending& p : pending_) {
      Check(p.call->answered(), "a call was never answered");
      if (!p.call->Wait().ok()) continue;
      Check(p.partition < partitions_.size(), "a pull of an unknown partition was answered OK");
      Check(static_cast<int64_t>(p.call->values().size()) == partitions_[p.partition].length,
            "a pull was answered with values of another length than its partition's");
      Check(p.call->counter() >= p.min_version, "a pull was answered with an older version than it asked for");
    }
  }

 private:
  // The first Join that defines a model (the harness's, or one that differs) decides the
  // partitioning; from then on `partitions_` is the server's.
  void Learn() {
    if (learned_) return;
    const StatusSnapshot s = server_->Status();
    if (!s.model_defined) return;
    absl::StatusOr<PartitionMap> map = PartitionMap::Create(s.params, partition_bytes_);
    Check(map.ok(), "the server's model does not map");
    partitions_ = map->partitions();
    learned_ = true;
  }

  int Rank() { return in_.ConsumeIntegralInRange(-1, world_size_); }
  uint32_t Partition() { return Small<uint32_t>(in_, static_cast<uint32_t>(partitions_.size())); }

  std::shared_ptr<FakeCall> Track(uint32_t partition, uint64_t min_version) {
    auto call = std::make_shared<FakeCall>();
    pending_.push_back({call, partition, min_version});
    return call;
  }

  void Join() {
    JoinRequestView v;
    v.rank = Rank();
    v.world_size = in_.ConsumeBool() ? world_size_ : in_.ConsumeIntegralInRange(0, 4);
    v.values_follow = in_.ConsumeBool();
    v.peer = "fuzz";
    std::vector<TensorSpec> specs = model_;
    if (in_.ConsumeIntegralInRange(0, 7) == 0) {  // now and then a model that differs
      TensorSpec& t = specs[in_.ConsumeIntegralInRange<size_t>(0, specs.size() - 1)];
      switch (in_.ConsumeIntegralInRange(0, 3)) {
        case 0: t.shape.push_back(in_.ConsumeIntegralInRange(-1, 3)); break;
        case 1: t.name = in_.ConsumeRandomLengthString(4); break;
        case 2: specs.pop_back(); break;
        default: specs.push_back(t); break;
      }
    }
    values_.clear();
    for (const TensorSpec& spec : specs) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d > 0 ? d : 1;
      values_.push_back(v.values_follow && in_.ConsumeBool() ? std::string() : Values(in_, n));
    }
    for (size_t i = 0; i < specs.size(); ++i) v.params.push_back({specs[i], values_[i]});
    absl::StatusOr<JoinResult> joined = server_->Join(v);
    Learn();
    if (joined.ok()) {
      Check(joined->rank >= 0 && joined->rank < world_size_, "a join was given a rank outside the group");
      Check(joined->partitions.size() == partitions_.size(), "a join was given another partitioning");
      for (size_t i = 0; i < partitions_.size(); ++i) {
        Check(joined->partitions[i].offset == partitions_[i].offset &&
                  joined->partitions[i].length == partitions_[i].length,
              "a join was given another partitioning");
      }
    }
  }

  void Initialize() {
    InitializeView v;
    v.rank = Rank();
    v.partition = Partition();
    v.dtype_is_float32 = in_.ConsumeIntegralInRange(0, 7) != 0;
    values_.assign(1, Values(in_, v.partition < partitions_.size() ? partitions_[v.partition].length : 1));
    v.data = values_[0];
    server_->Initialize(v).IgnoreError();
  }

  PushRequestView PushView() {
    PushRequestView v;
    v.rank = Rank();
    v.step = Small<uint64_t>(in_, 6);
    v.partition = Partition();
    v.num_examples = in_.ConsumeIntegralInRange<int64_t>(-1, 64);
    // Mostly float32; sometimes a 16-bit dtype, sparse (top-k) values, or a dtype unknown.
    switch (in_.ConsumeIntegralInRange(0, 9)) {
      case 0: v.dtype = std::nullopt; break;
      case 1: v.dtype = WireDType::kBfloat16; break;
      case 2: v.dtype = WireDType::kFloat16; break;
      default: v.dtype = WireDType::kFloat32; break;
    }
    v.sparse = in_.ConsumeIntegralInRange(0, 5) == 0;
    const int64_t length = v.partition < partitions_.size() ? partitions_[v.partition].length : 1;
    const int width = v.dtype.has_value() ? WireDTypeBytes(*v.dtype) : 4;
    if (v.sparse) {
      // k ascending positions (sometimes not: a refusal), then k values.
      const int64_t k = in_.ConsumeIntegralInRange<int64_t>(0, length + 1);
      std::string s;
      uint32_t position = 0;
      for (int64_t j = 0; j < k; ++j) {
        position += in_.ConsumeIntegralInRange<uint32_t>(j == 0 ? 0 : 1, 2);
        s.append(reinterpret_cast<const char*>(&position), sizeof(position));
      }
      s += in_.ConsumeBytesAsString(in_.ConsumeBool() ? k * width : in_.ConsumeIntegralInRange<size_t>(0, k * 8 + 2));
      values_.assign(1, s);
    } else {
      values_.assign(1, Values(in_, length, width));
    }
    v.data = values_[0];
    v.peer = "fuzz";
    return v;
  }

  FuzzedDataProvider& in_;
  FakeClock clock_;
  std::vector<TensorSpec> model_;
  std::vector<PartitionRange> partitions_;
  int world_size_ = 0;
  int64_t partition_bytes_ = 0;
  bool learned_ = false;
  std::unique_ptr<ParameterServer> server_;
  std::vector<Pending> pending_;
  std::vector<std::string> values_;  // the bytes the current request's views point into
};

}  // namespace
}  // namespace summa::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  summa::server::Session session(in);
  if (!session.Start()) return 0;
  for (int i = 0; i < 256 && in.remaining_bytes() > 0; ++i) session.Step();
  session.Finish();
  return 0;
}
