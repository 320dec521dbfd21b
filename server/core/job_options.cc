#include "server/core/job_options.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace summa::server {
namespace {

// Finds `name` among `names` (indexed by the enum's values).
template <typename E, size_t N>
absl::StatusOr<E> Parse(absl::string_view what, absl::string_view name, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  std::string choices;
  for (size_t i = 0; i < N; ++i) absl::StrAppend(&choices, i == 0 ? "" : i + 1 == N ? " or " : ", ", names[i]);
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " '", name, "': use ", choices));
}

constexpr const char* kModeNames[] = {"sync", "async", "ssp"};
constexpr const char* kLossNames[] = {"wait", "shrink"};
constexpr const char* kNonFiniteNames[] = {"reject", "skip_step", "zero"};

}  // namespace

const char* ModeName(Mode mode) { return kModeNames[static_cast<int>(mode)]; }
const char* OnWorkerLossName(OnWorkerLoss policy) { return kLossNames[static_cast<int>(policy)]; }
const char* NonFiniteName(NonFinite policy) { return kNonFiniteNames[static_cast<int>(policy)]; }

absl::StatusOr<Mode> ParseMode(absl::string_view name) { return Parse<Mode>("mode", name, kModeNames); }
absl::StatusOr<std::pair<Mode, bool>> ParseJobMode(absl::string_view name) {
  if (name == "diloco") return std::make_pair(Mode::kSync, true);
  if (name == "diloco-async") return std::make_pair(Mode::kAsync, true);
  absl::StatusOr<Mode> mode = ParseMode(name);
  if (!mode.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", name, "': use ", absl::StrJoin(kModeNames, ", "), ", diloco or diloco-async"));
  }
  return std::make_pair(*mode, false);
}

std::string JobModeName(Mode mode, int sync_every) {
  if (sync_every > 0) return mode == Mode::kSync ? "diloco" : "diloco-async";
  return ModeName(mode);
}

std::string JobModeName(const ServerOptions& options) { return JobModeName(options.mode, options.sync_every); }

absl::StatusOr<OnWorkerLoss> ParseOnWorkerLoss(absl::string_view name) {
  return Parse<OnWorkerLoss>("worker-loss policy", name, kLossNames);
}
absl::StatusOr<NonFinite> ParseNonFinite(absl::string_view name) {
  return Parse<NonFinite>("non-finite policy", name, kNonFiniteNames);
}

summa::v1::Mode ModeToProto(Mode mode) {
  switch (mode) {
    case Mode::kSync: return summa::v1::MODE_SYNC;
    case Mode::kAsync: return summa::v1::MODE_ASYNC;
    case Mode::kSsp: return summa::v1::MODE_SSP;
  }
  return summa::v1::MODE_UNSPECIFIED;
}

absl::StatusOr<Mode> ModeFromProto(summa::v1::Mode mode) {
  switch (mode) {
    case summa::v1::MODE_SYNC: return Mode::kSync;
    case summa::v1::MODE_ASYNC: return Mode::kAsync;
    case summa::v1::MODE_SSP: return Mode::kSsp;
    default: return absl::InvalidArgumentError(absl::StrCat("unknown mode ", static_cast<int>(mode)));
  }
}

absl::StatusOr<int> ShardFromHostname(const char* hostname) {
  const absl::string_view name = hostname != nullptr ? hostname : "";
  const size_t dash = name.rfind('-');
  int ordinal = -1;
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(name.substr(dash + 1), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shards > 1 needs --shard, or a $HOSTNAME ending in a StatefulSet ordinal (summa-server-1); "
        "$HOSTNAME is '", name, "'"));
  }
  return ordinal;
}

absl::StatusOr<std::pair<int, int>> ParseWorkers(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  int min = 0, max = 0;
  const bool parsed = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &min) &&
                      absl::SimpleAtoi(parts.back(), &max);
  if (!parsed || min < 1 || max < min) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers=", text, ": give N (a fixed group of N workers) or MIN:MAX with 1 <= MIN <= MAX "
        "(an elastic job starting with MIN)"));
  }
  return std::make_pair(min, max);
}

absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of workers must be at least 1, got ", options.world_size));
  }
  if (options.min_workers < 0 || options.min_workers > options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--workers=", options.min_workers, ":", options.world_size,
                                                   ": MIN must be between 1 and MAX"));
  }
  if (options.min_workers > 0 && options.min_workers < options.world_size && options.shards > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers=", options.min_workers, ":", options.world_size, " with --shards=", options.shards,
        ": an elastic job runs on one server shard (the shards would have to agree on each joiner's "
        "first step); give --workers=N, or one shard"));
  }
  if (options.partition_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition size must be at least 4 bytes, got ", options.partition_bytes));
  }
  if (options.shards < 1 || options.shard < 0 || options.shard >= options.shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " of ", options.shards,
                                                   ": give --shards=K (K >= 1) and --shard=I with 0 <= I < K"));
  }
  if (options.barrier_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the barrier deadline must be positive");
  }
  if (options.lease <= absl::ZeroDuration()) return absl::InvalidArgumentError("the lease must be positive");
  if (options.rejoin_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the rejoin deadline must be positive");
  }
  if (options.staleness < 0) return absl::InvalidArgumentError("staleness must not be negative");
  if (options.deterministic && options.mode != Mode::kSync) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deterministic aggregation needs sync mode (--mode=sync), not ", ModeName(options.mode),
        ": async and ssp apply each push alone, in the order pushes arrive"));
  }
  if (options.backup_workers != 0) {
    const int group = options.min_workers > 0 ? options.min_workers : options.world_size;
    if (options.mode != Mode::kSync) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backup_workers=", options.backup_workers, " needs sync mode (--mode=sync), not ", ModeName(options.mode),
          ": async and ssp apply each push alone and wait for no step"));
    }
    if (options.backup_workers < 0 || options.backup_workers >= group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backup_workers=", options.backup_workers, " must be at least 0 and less than the ", group,
          " workers the job starts with (--workers", options.min_workers > 0 && options.min_workers < options.world_size
              ? absl::StrCat("=", options.min_workers, ":", options.world_size, "'s MIN") : "",
          "): a step completes once group size - B ranks have pushed it"));
    }
  }
  if (options.sync_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--sync_every=", options.sync_every, " must be at least 1"));
  }
  if (options.sync_every > 0) {
    if (options.mode == Mode::kSsp) {
      return absl::InvalidArgumentError("DiLoCo's outer steps are sync (--mode=diloco) or async (--mode=diloco-async), not ssp");
    }
    if (options.wire_dtype == WireDType::kFloat16) {
      return absl::InvalidArgumentError(
          "--wire_dtype=fp16 with --mode=diloco: a pseudo-gradient travels times its examples (H local steps' "
          "worth), past fp16's range of 65504; use bf16 (fp32's range)");
    }
    if (options.backup_workers != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backup_workers=", options.backup_workers, " with --mode=diloco: an outer step waits for every "
          "member's pseudo-gradient (a late one would throw away its H steps); use --mode=diloco-async for "
          "workers of different speeds"));
    }
  }
  if (options.checkpoint_every < 0) {
    return absl::InvalidArgumentError("the checkpoint interval must not be negative");
  }
  if (options.keep_checkpoints < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("at least 1 checkpoint must be kept, got --keep_checkpoints=", options.keep_checkpoints));
  }
  if (!options.export_path.empty() && options.shards > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--export writes the whole model, and shard ", options.shard, " of ", options.shards,
        " holds only its partitions: export a sharded job's weights from its checkpoints with "
        "summa-checkpoint export ", options.checkpoint_dir.empty() ? "CHECKPOINT_DIR" : options.checkpoint_dir,
        " OUT.safetensors"));
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("no clock");
  if (absl::Status s = ValidateLimits(options.limits, options.partition_bytes); !s.ok()) return s;
  return Optimizer::Create(options.optimizer).status();
}

}  // namespace summa::server
