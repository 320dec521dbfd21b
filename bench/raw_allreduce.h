// The reference the benchmark holds Summa's AllReduce against: the exchange a parameter server
// does, over plain TCP sockets and nothing else. Each round, every rank sends its S-byte float32
// tensor (in writes of 1 MiB); the server reads all of them, adding each chunk into one sum as it
// arrives (memory O(S), not O(ranks x S)), and once every tensor is in (no pipelining) sends the
// S-byte sum back to every rank. No framing: the size is agreed on the command line.
#ifndef SUMMA_BENCH_RAW_ALLREDUCE_H_
#define SUMMA_BENCH_RAW_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace summa::bench {

// The largest read or write either side makes at once.
inline constexpr int64_t kRawChunkBytes = 1 << 20;

struct RawServerOptions {
  int group_size = 1;
  int64_t bytes = 0;      // per tensor, a multiple of 4
  std::string port_file;  // the port bound on 127.0.0.1 is written here once listening
  absl::Duration timeout = absl::Minutes(10);  // bounds the whole run, and the idle wait after it
};

// Listens on 127.0.0.1 (port chosen by the OS), accepts `group_size` ranks and serves rounds
// until every rank has closed its connection between rounds. Then it stays up (so that the
// driver can read its peak RSS) until a signal ends it or the timeout passes. Single-threaded:
// poll over non-blocking sockets.
absl::Status RunRawServer(const RawServerOptions& options);

// One rank's connection to the raw server. Not thread-safe.
class RawAllReduceClient {
 public:
  // `address` is 127.0.0.1:PORT; `timeout` bounds the connect and every send or receive.
  static absl::StatusOr<std::unique_ptr<RawAllReduceClient>> Connect(const std::string& address,
                                                                     absl::Duration timeout);
  ~RawAllReduceClient();
  RawAllReduceClient(const RawAllReduceClient&) = delete;
  RawAllReduceClient& operator=(const RawAllReduceClient&) = delete;

  // Sends `in`, then receives the sum into `out` (the same size; every rank's tensor must be the
  // size the server was started with).
  absl::Status AllReduce(const std::vector<float>& in, std::vector<float>& out);

 private:
  explicit RawAllReduceClient(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace summa::bench

#endif  // SUMMA_BENCH_RAW_ALLREDUCE_H_
