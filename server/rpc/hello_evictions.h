// Which connection still in its hello a newcomer to the socket data plane evicts
// (server/rpc/socket_plane.h): the rule alone, without sockets, so that its choices between
// sources can be tested where every test connection comes from 127.0.0.1.
#ifndef SUMMA_SERVER_RPC_HELLO_EVICTIONS_H_
#define SUMMA_SERVER_RPC_HELLO_EVICTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace summa::server {

// The bounds on connections in their hello (SocketPlaneOptions'), each at least 1.
struct HelloBounds {
  int64_t total = 0;
  int64_t per_source = 0;
};

// Which bound an eviction makes room under.
enum class HelloBound { kPerSource, kTotal };

struct HelloEviction {
  size_t index = 0;  // into the connections given
  HelloBound bound = HelloBound::kPerSource;
  bool silent = false;  // what `silent` said of it
};

// `sources`: the source address (host, no port) of each connection in its hello, oldest first.
// For a newcomer from `source`: the connection to evict before it is taken, or nullopt when both
// bounds have room for it. Past the per-source bound the newcomer's own source gives one up, past
// the total the source holding the most (of those holding equally many, the one whose oldest is
// oldest); of that source's, the oldest for which `silent` (asked lazily, oldest first) is true,
// else its oldest. Evicting one at a time until this says nullopt brings both bounds within.
std::optional<HelloEviction> PickHelloEviction(absl::Span<const absl::string_view> sources, absl::string_view source,
                                               const HelloBounds& bounds, absl::FunctionRef<bool(size_t)> silent);

}  // namespace summa::server

#endif  // SUMMA_SERVER_RPC_HELLO_EVICTIONS_H_
