#include "server/rpc/hello_evictions.h"

#include "absl/container/flat_hash_map.h"

namespace summa::server {

std::optional<HelloEviction> PickHelloEviction(absl::Span<const absl::string_view> sources, absl::string_view source,
                                               const HelloBounds& bounds, absl::FunctionRef<bool(size_t)> silent) {
  absl::flat_hash_map<absl::string_view, int64_t> held;
  for (absl::string_view s : sources) ++held[s];
  absl::string_view from;
  HelloBound bound;
  if (auto own = held.find(source); own != held.end() && own->second >= bounds.per_source) {
    from = source;
    bound = HelloBound::kPerSource;
  } else if (static_cast<int64_t>(sources.size()) >= bounds.total) {
    // Oldest first, so that the first source seen with the most is the one whose oldest is oldest.
    int64_t most = 0;
    for (absl::string_view s : sources) {
      if (held[s] > most) {
        most = held[s];
        from = s;
      }
    }
    bound = HelloBound::kTotal;
  } else {
    return std::nullopt;
  }
  std::optional<size_t> oldest;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] != from) continue;
    if (!oldest.has_value()) oldest = i;
    if (silent(i)) return HelloEviction{i, bound, /*silent=*/true};
  }
  if (!oldest.has_value()) return std::nullopt;  // bounds below 1, and none in their hello
  return HelloEviction{*oldest, bound, /*silent=*/false};
}

}  // namespace summa::server
