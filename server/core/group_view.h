// GroupView: the job's group as a versioned value, published by Membership (server/core/
// membership.h): the view number, which moves each time the group changes, and the ranks in it.
// A sync step runs under the group it started with (Partition::step_group): a rank excluded
// since leaves the step (it completes with the ranks left); a rank admitted since (growth, the
// elastic jobs) takes part from the step Membership admitted it from. Shrink, rejoin, shards and the AllReduce's members' rounds read it instead
// of a fixed world size; growth (the elastic jobs) is one more view, not a new mechanism.
// A plain value; thread-compatible.
#ifndef SUMMA_SERVER_CORE_GROUP_VIEW_H_
#define SUMMA_SERVER_CORE_GROUP_VIEW_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace summa::server {

struct GroupView {
  uint64_t view = 0;
  std::vector<int> ranks;  // ascending

  // Ranks 0..n-1 at view 0: a job's group before anyone left.
  static GroupView Whole(int n) {
    GroupView g;
    g.ranks.resize(n);
    std::iota(g.ranks.begin(), g.ranks.end(), 0);
    return g;
  }
  bool Contains(int rank) const { return std::binary_search(ranks.begin(), ranks.end(), rank); }
  int size() const { return static_cast<int>(ranks.size()); }
  // This view's ranks that `newer` still holds, at `newer`'s number: what a step that started
  // under this view runs under once the group moved to `newer`.
  GroupView Narrowed(const GroupView& newer) const {
    GroupView g;
    g.view = newer.view;
    std::set_intersection(ranks.begin(), ranks.end(), newer.ranks.begin(), newer.ranks.end(),
                          std::back_inserter(g.ranks));
    return g;
  }
  bool operator==(const GroupView& other) const { return view == other.view && ranks == other.ranks; }
};

// The group of the steps from `from_step` on (until the next change): one entry of a job's data
// position, from which the examples each rank covered in every step follow.
struct GroupChange {
  uint64_t from_step = 0;
  GroupView group;
};

}  // namespace summa::server

#endif  // SUMMA_SERVER_CORE_GROUP_VIEW_H_
