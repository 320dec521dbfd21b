// The AllReduce hub (server/core/all_reduce.h): AllReduceContribution sequences to fixed-group and
// member collectives, between membership changes (joins, leaves, lapsed leases, the job's end),
// round expiries and clock moves chosen by the fuzz input, on a FakeClock (nothing sleeps). The
// checks: nothing crashes; every call is answered exactly once by the end (after Shutdown); the
// calls answered OK for one round of one collective all got the same sum, of their tensor's
// length.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "common/clock.h"
#include "common/logging.h"
#include "server/core/all_reduce.h"
#include "server/core/membership.h"
#include "tests/fake_call.h"

namespace summa::server {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "all_reduce_fuzzer: %s\n", what);
    std::abort();
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Pending {
  std::shared_ptr<FakeCall> call;
  std::string name;
  int64_t elements;
};

}  // namespace
}  // namespace summa::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace summa;
  using namespace summa::server;
  FuzzedDataProvider in(data, size);
  FakeClock clock;
  const int world_size = in.ConsumeIntegralInRange(1, 4);
  Membership members(world_size, in.ConsumeBool() ? OnWorkerLoss::kShrink : OnWorkerLoss::kWait,
                     absl::Seconds(in.ConsumeIntegralInRange(1, 10)),
                     absl::Seconds(in.ConsumeIntegralInRange(1, 60)), &clock, /*require_sessions=*/false);
  AllReduceHub hub(absl::Seconds(in.ConsumeIntegralInRange(1, 30)), &clock, &members);
  members.AddObserver([&hub] { hub.OnMembershipChange(); });

  std::vector<Pending> pending;
  for (int i = 0; i < 256 && in.remaining_bytes() > 0; ++i) {
    switch (in.ConsumeIntegralInRange(0, 7)) {
      case 0:
      case 1:
      case 2: {
        AllReduceContribution c;
        c.name = in.PickValueInArray({"loss", "acc", "chunk-0", ""});
        c.members = in.ConsumeBool();
        c.group_size = in.ConsumeIntegralInRange(-1, 5);
        c.rank = in.ConsumeIntegralInRange(-1, 5);
        c.round = in.ConsumeIntegralInRange<uint64_t>(0, 7);
        if (c.round == 7) c.round = in.ConsumeIntegral<uint64_t>();
        c.spec.name = "t";
        const int dims = in.ConsumeIntegralInRange(0, 2);
        for (int d = 0; d < dims; ++d) c.spec.shape.push_back(in.ConsumeIntegralInRange(0, 3));
        int64_t n = 1;
        for (int64_t d : c.spec.shape) n *= d;
        const size_t bytes = in.ConsumeBool() ? n * 4 : in.ConsumeIntegralInRange<size_t>(0, 40);
        const std::string values = in.ConsumeBytesAsString(bytes);
        c.data = values;
        auto call = std::make_shared<FakeCall>();
        pending.push_back({call, c.name, n});
        hub.Contribute(c, call);
        break;
      }
      case 3: members.Admit(in.ConsumeIntegralInRange(-1, world_size), "fuzz", "").IgnoreError(); break;
      case 4: members.Leave(in.ConsumeIntegralInRange(-1, world_size), 0).IgnoreError(); break;
      case 5:
        clock.Advance(absl::Seconds(in.ConsumeIntegralInRange(0, 40)));
        members.Tick(clock.Now());
        hub.ExpireRounds(clock.Now());
        break;
      case 6: members.Touch(in.ConsumeIntegralInRange(-1, world_size), 0).IgnoreError(); break;
      default:
        if (in.ConsumeIntegralInRange(0, 7) == 0) members.EndJob("fuzz");
        break;
    }
  }
  hub.Shutdown();

  // (name, round) -> the sum its callers got. Round 0 is left out: only a round number that
  // wrapped past 2^64 - 1 completes as 0, and two such rounds may.
  std::map<std::pair<std::string, uint64_t>, const std::vector<float>*> sums;
  for (const Pending& p : pending) {
    Check(p.call->answered(), "a call was never answered");
    if (!p.call->Wait().ok()) continue;
    Check(static_cast<int64_t>(p.call->values().size()) == p.elements,
          "a call was answered with a sum of another length than its tensor's");
    if (p.call->counter() == 0) continue;
    auto [it, first] = sums.insert({{p.name, p.call->counter()}, &p.call->values()});
    Check(first || SameBits(*it->second, p.call->values()), "the callers of one round got different sums");
  }
  return 0;
}
