#include "server/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace summa::server {
namespace {

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && entry.path().extension() == ".summa") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

using Readers = absl::Span<CheckpointReader* const>;

// Opens `paths` and hands their readers to `restore`: true once it succeeds (with the first file's
// header in `header`); false, with a line in `warnings`, when a file is torn or corrupt (so
// `restore` must leave nothing behind when it fails); any other failure of `restore`, naming
// `what`.
absl::StatusOr<bool> RestoreFrom(const std::vector<std::string>& paths, const std::string& what,
                                 absl::FunctionRef<absl::Status(Readers)> restore, std::vector<std::string>* warnings,
                                 summa::v1::Checkpoint* header, absl::string_view verb = "restore") {
  std::vector<std::unique_ptr<CheckpointReader>> readers;
  std::vector<CheckpointReader*> handed;
  for (const std::string& path : paths) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    if (!reader.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", reader.status().message()));
      return false;
    }
    handed.push_back(reader->get());
    readers.push_back(*std::move(reader));
  }
  const absl::Status restored = restore(handed);
  if (restored.ok()) {
    *header = readers.front()->header();
    return true;
  }
  for (const auto& reader : readers) {
    const absl::Status whole = reader->Verify();
    if (!whole.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", whole.message()));
      return false;
    }
  }
  return absl::Status(restored.code(), absl::StrCat("cannot ", verb, " ", what, ": ", restored.message()));
}

// A set of another shard count that no version is whole in, as a person reads it.
std::string Incomplete(const std::string& dir, const CheckpointSet& set) {
  std::vector<std::string> kept;
  for (int i = 0; i < set.shards; ++i) {
    kept.push_back(set.versions[i].empty()
                       ? absl::StrCat("shard ", i, " none (", set.dirs[i], " is missing or empty)")
                       : absl::StrCat("shard ", i, " keeps ", absl::StrJoin(set.versions[i], ", ")));
  }
  return absl::StrCat(dir, " holds checkpoints of the job on ", set.shards, " shards, but no version every one of them keeps (",
                      absl::StrJoin(kept, "; "), ")");
}

}  // namespace

std::string CheckpointPath(const std::string& dir, uint64_t version) {
  return absl::StrFormat("%s/ckpt-%012d.summa", dir, version);
}

std::vector<uint64_t> CheckpointVersions(const std::string& dir) {
  std::vector<uint64_t> versions;
  for (const std::string& path : CheckpointFiles(dir)) {
    const std::string name = std::filesystem::path(path).stem().string();  // ckpt-000000000012
    uint64_t version;
    if (absl::SimpleAtoi(absl::string_view(name).substr(5), &version)) versions.push_back(version);
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

absl::Status RemoveCheckpointsAfter(const std::string& dir, uint64_t version) {
  for (uint64_t v : CheckpointVersions(dir)) {
    if (v <= version) continue;
    std::error_code ec;
    const std::string path = CheckpointPath(dir, v);
    std::filesystem::remove(path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreNewestCheckpoint(
    const std::string& dir, absl::FunctionRef<absl::Status(CheckpointReader&)> restore,
    std::vector<std::string>* warnings) {
  std::vector<std::string> candidates = CheckpointFiles(dir);
  std::reverse(candidates.begin(), candidates.end());
  for (const std::string& path : candidates) {
    summa::v1::Checkpoint header;
    SUMMA_ASSIGN_OR_RETURN(const bool restored,
                           RestoreFrom({path}, path, [&](Readers r) { return restore(*r[0]); }, warnings, &header));
    if (restored) return RestoredCheckpoint{path, std::move(header)};
  }
  return std::nullopt;
}

void KeepNewestCheckpoints(const std::string& dir, int keep) {
  const std::vector<std::string> all = CheckpointFiles(dir);
  std::error_code ec;
  for (size_t i = 0; i + keep < all.size(); ++i) std::filesystem::remove(all[i], ec);
}

std::string ShardCheckpointDir(const std::string& dir, int shard, int shards) {
  if (dir.empty() || shards <= 1) return dir;
  return absl::StrCat(dir, "/shard-", shard, "-of-", shards);
}

std::vector<uint64_t> CheckpointSet::CommonVersions() const {
  std::vector<uint64_t> common = versions.empty() ? std::vector<uint64_t>() : versions[0];
  for (size_t i = 1; i < versions.size(); ++i) {
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), versions[i].begin(), versions[i].end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  return common;
}

std::vector<CheckpointSet> FindCheckpointSets(const std::string& dir) {
  std::map<int, CheckpointSet> sets;
  auto set_of = [&](int shards) -> CheckpointSet& {
    CheckpointSet& set = sets[shards];
    if (set.dirs.empty()) {
      set.shards = shards;
      for (int i = 0; i < shards; ++i) set.dirs.push_back(ShardCheckpointDir(dir, i, shards));
      set.versions.resize(shards);
    }
    return set;
  };
  if (std::vector<uint64_t> own = CheckpointVersions(dir); !own.empty()) set_of(1).versions[0] = std::move(own);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();  // shard-I-of-K
    const size_t of = name.find("-of-");
    int shard, shards;
    // Only the names ShardCheckpointDir gives (no shard-01-of-2), and no count that would make a
    // set of a million empty shards.
    if (name.rfind("shard-", 0) != 0 || of == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(name).substr(6, of - 6), &shard) ||
        !absl::SimpleAtoi(absl::string_view(name).substr(of + 4), &shards) || shards < 2 || shards > (1 << 16) ||
        shard < 0 || shard >= shards || name != absl::StrCat("shard-", shard, "-of-", shards)) {
      continue;
    }
    std::vector<uint64_t> versions = CheckpointVersions(entry.path().string());
    if (!versions.empty()) set_of(shards).versions[shard] = std::move(versions);
  }
  std::vector<CheckpointSet> found;
  for (auto& [shards, set] : sets) found.push_back(std::move(set));
  return found;
}

absl::StatusOr<std::optional<RestoredCheckpoint>> RestoreNewestForShard(
    const std::string& dir, int shard, int shards, absl::FunctionRef<absl::Status(CheckpointReader&)> restore,
    absl::FunctionRef<absl::Status(Readers)> reshard, std::vector<std::string>* warnings) {
  const std::string own = ShardCheckpointDir(dir, shard, shards);
  // Its own shard count's set is left out: each of its shards restores its own files (and the
  // workers roll them back to one version where they differ).
  std::vector<CheckpointSet> sets = FindCheckpointSets(dir);
  sets.erase(std::remove_if(sets.begin(), sets.end(), [&](const CheckpointSet& s) { return s.shards == shards; }),
             sets.end());
  struct Candidate {
    uint64_t version;
    const CheckpointSet* set;  // null: its own
  };
  std::vector<Candidate> candidates;
  for (uint64_t v : CheckpointVersions(own)) candidates.push_back({v, nullptr});
  for (const CheckpointSet& set : sets) {
    for (uint64_t v : set.CommonVersions()) candidates.push_back({v, &set});
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.version != b.version ? a.version > b.version : a.set == nullptr && b.set != nullptr;
  });
  for (const CheckpointSet& set : sets) {
    if (!set.CommonVersions().empty()) continue;
    uint64_t newest = 0;
    for (const std::vector<uint64_t>& v : set.versions) newest = std::max(newest, v.empty() ? 0 : v.back());
    if (candidates.empty() || newest > candidates.front().version) {
      return absl::FailedPreconditionError(absl::StrCat(
          Incomplete(dir, set), ", newer than ",
          candidates.empty() ? "any checkpoint of this shard's"
                             : absl::StrCat("version ", candidates.front().version, ", the newest this shard can restore"),
          ": a restart on ", shards, shards == 1 ? " server" : " shards",
          " takes every partition from the old shards' checkpoints of one version. Bring back the missing "
          "shards' files, or move the set's directories out of ",
          dir, " to start without them (the shards of an async or ssp job checkpoint versions of their own: "
          "restart it on its own shard count)"));
    }
  }
  for (const Candidate& c : candidates) {
    summa::v1::Checkpoint header;
    if (c.set == nullptr) {
      const std::string path = CheckpointPath(own, c.version);
      SUMMA_ASSIGN_OR_RETURN(const bool restored,
                             RestoreFrom({path}, path, [&](Readers r) { return restore(*r[0]); }, warnings, &header));
      if (restored) return RestoredCheckpoint{path, std::move(header)};
      continue;
    }
    std::vector<std::string> paths;
    for (const std::string& d : c.set->dirs) paths.push_back(CheckpointPath(d, c.version));
    const std::string what = absl::StrCat("the checkpoints of version ", c.version, " of ", c.set->shards, " shards (",
                                          absl::StrJoin(paths, ", "), ")");
    SUMMA_ASSIGN_OR_RETURN(const bool restored, RestoreFrom(paths, what, reshard, warnings, &header));
    if (restored) return RestoredCheckpoint{paths[0], std::move(header), c.set->shards};
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<RestoredCheckpoint>> ReadNewestWholeCheckpoint(
    const std::string& dir, absl::FunctionRef<absl::Status(Readers)> read, std::vector<std::string>* warnings) {
  const std::vector<CheckpointSet> sets = FindCheckpointSets(dir);
  std::vector<std::pair<uint64_t, const CheckpointSet*>> candidates;
  for (const CheckpointSet& set : sets) {
    for (uint64_t v : set.CommonVersions()) candidates.emplace_back(v, &set);
  }
  // Sets come by shard count ascending: a stable sort by version keeps the fewer shards first.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [version, set] : candidates) {
    std::vector<std::string> paths;
    for (const std::string& d : set->dirs) paths.push_back(CheckpointPath(d, version));
    const std::string what = set->shards == 1 ? paths[0]
                                              : absl::StrCat("the checkpoints of version ", version, " of ",
                                                             set->shards, " shards (", absl::StrJoin(paths, ", "), ")");
    summa::v1::Checkpoint header;
    SUMMA_ASSIGN_OR_RETURN(const bool done, RestoreFrom(paths, what, read, warnings, &header, "read"));
    if (done) return RestoredCheckpoint{paths[0], std::move(header), set->shards};
  }
  return std::nullopt;
}

}  // namespace summa::server
