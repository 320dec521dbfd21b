#include "server/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    if (!reader.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", reader.status().message()));
      continue;
    }
    const absl::Status restored = restore(**reader);
    if (restored.ok()) return RestoredCheckpoint{path, (*reader)->header()};
    const absl::Status whole = (*reader)->Verify();
    if (!whole.ok()) {
      warnings->push_back(absl::StrCat("ignoring checkpoint: ", whole.message()));
      continue;
    }
    return absl::Status(restored.code(), absl::StrCat("cannot restore ", path, ": ", restored.message()));
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

}  // namespace summa::server
