// summa-worker's flags (worker/flags.cc) against the options they fill: each flag's default is its
// field's default in a default-constructed struct (WorkerOptions, TrainerOptions, SyntheticOptions
// for the flags a synthetic worker takes too), and the default flags give the default options.
#include "worker/flags.h"

#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace summa::worker {
namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

template <typename T>
std::string Text(const T& value) {
  return absl::UnparseFlag<T>(value);
}

// Every flag that fills a field of WorkerOptions (and its TrainerOptions), with that field's
// value in `o` as the flag would spell it.
// --fault_pause's text for the field it fills.
std::string Pauses(const std::vector<std::pair<int64_t, std::string>>& pauses) {
  std::vector<std::string> items;
  for (const auto& [step, file] : pauses) items.push_back(absl::StrCat(step, ":", file));
  return absl::StrJoin(items, ",");
}

// --fault_replay_groups's text for the field it fills.
std::string ReplayGroups(const std::vector<std::pair<uint64_t, int>>& groups) {
  std::vector<std::string> items;
  for (const auto& [from, n] : groups) items.push_back(absl::StrCat(from, ":", n));
  return absl::StrJoin(items, ",");
}

// --fault_replay_summed's text for the field it fills.
std::string ReplaySummed(const std::vector<std::pair<uint64_t, std::vector<int>>>& summed) {
  std::vector<std::string> items;
  for (const auto& [from, devices] : summed) items.push_back(absl::StrCat(from, ":", absl::StrJoin(devices, "+")));
  return absl::StrJoin(items, ",");
}

Rows AsFlags(const WorkerOptions& o) {
  const TrainerOptions& t = o.trainer;
  Rows rows = {
      {"server", o.server},
      {"rank", Text(t.rank)},
      {"world_size", Text(t.world_size)},
      {"batch_size", Text(t.batch_size)},
      {"epochs", Text(t.epochs)},
      {"model", t.model},
      {"device", o.device},
      {"model_parallel", Text(t.model_parallel)},
      {"micro_batches", Text(t.micro_batches)},
      {"overlap", Text(t.overlap)},
      {"inner_optimizer", t.inner.name},
      {"inner_lr", Text(t.inner.learning_rate)},
      {"inner_momentum", Text(t.inner.momentum)},
      {"inner_weight_decay", Text(t.inner.weight_decay)},
      {"inner_nesterov", Text(t.inner.nesterov)},
      {"inner_beta1", Text(t.inner.beta1)},
      {"inner_beta2", Text(t.inner.beta2)},
      {"inner_eps", Text(t.inner.eps)},
      {"data_dir", o.data_dir},
      {"seed", Text(t.seed)},
      {"threads", Text(o.threads)},
      {"status_address", o.status_address},
      {"status_port_file", o.status_port_file},
      {"metrics_address", o.metrics_address},
      {"metrics_port_file", o.metrics_port_file},
      {"train_limit", Text(o.train_limit)},
      {"test_limit", Text(o.test_limit)},
      {"call_deadline", Text(o.call_deadline)},
      {"retry_deadline", Text(t.retry_deadline)},
      {"join_deadline", Text(o.join_deadline)},
      {"trace_file", o.trace_file},
      {"example_log", o.example_log},
      {"after_training", o.after_training_wait ? "wait" : "exit"},
      {"tls_ca", o.tls.ca},
      {"tls_cert", o.tls.cert},
      {"tls_key", o.tls.key},
      {"token_file", o.token_file},
      {"channels", Text(o.channels)},
      {"data_plane", DataPlaneName(o.data_plane)},
  };
#if SUMMA_FAULT_INJECTION
  rows.insert(rows.end(), {{"fault_exit_after_push", Text(o.faults.exit_after_push)},
                           {"fault_repeat_pushpull_at", Text(o.faults.repeat_push_pull_at)},
                           {"fault_exit_before_epoch_end", Text(o.faults.exit_before_round)},
                           {"fault_delay_push", Text(o.faults.delay_push)},
                           {"fault_replay_groups", ReplayGroups(o.trainer.replay_groups)},
                           {"fault_replay_summed", ReplaySummed(o.trainer.replay_summed)},
                           {"fault_pause", Pauses(o.faults.pauses)},
                           {"fault_hold_push_until_fenced", o.faults.hold_push_until_fenced ? "true" : "false"}});
#endif
  return rows;
}

// The flags a synthetic worker takes, as they fill SyntheticOptions (--synthetic itself aside).
Rows AsFlags(const SyntheticOptions& o) {
  return {
      {"steps", Text(o.steps)},
      {"rank", Text(o.rank)},
      {"world_size", Text(o.world_size)},
      {"server", o.server},
      {"call_deadline", Text(o.call_deadline)},
      {"join_deadline", Text(o.join_deadline)},
      {"channels", Text(o.channels)},
      {"data_plane", DataPlaneName(o.data_plane)},
  };
}

// Flags whose default stands for something no field can hold, and what it is.
const Rows kSentinels = {
    {"rank", "-2"},  // $JOB_COMPLETION_INDEX when set, else -1 (the server assigns a rank)
};

// Flags that fill no field with their own value: --devices overrides --device; --progress
// (auto, always, never) becomes TrainerOptions::progress_bar, auto as whether stdout is a
// terminal; --synthetic=SIZE chooses the synthetic worker, and its SIZE (no default a run can
// take) is SyntheticOptions::model_bytes.
const std::set<std::string> kNoField = {"devices", "progress", "synthetic"};

std::string DefaultOf(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  EXPECT_NE(flag, nullptr) << "--" << name << " is not a flag of summa-worker";
  return flag != nullptr ? flag->DefaultValue() : "";
}

void ExpectDefaults(const Rows& fields, const char* of) {
  for (const auto& [name, field] : fields) {
    std::string want = field;
    for (const auto& [flag, value] : kSentinels) {
      if (flag == name) want = value;
    }
    EXPECT_EQ(DefaultOf(name), want) << "--" << name << ": the flag's default is not that of its field of " << of
                                     << " (" << field << ")";
  }
}

// Row by row, so that a failure names the flag.
void ExpectSame(const Rows& got, const Rows& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second, want[i].second) << "--" << got[i].first << " by default";
  }
}

TEST(WorkerFlagsTest, EachFlagDefaultsToItsFieldsDefault) {
  ExpectDefaults(AsFlags(WorkerOptions()), "WorkerOptions");
  ExpectDefaults(AsFlags(SyntheticOptions()), "SyntheticOptions");
}

TEST(WorkerFlagsTest, TheDefaultFlagsGiveTheDefaultOptions) {
  ::unsetenv("JOB_COMPLETION_INDEX");  // --rank's default is then -1
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  ExpectSame(AsFlags(*options), AsFlags(WorkerOptions()));
  EXPECT_EQ(options->trainer.progress_bar, ::isatty(STDOUT_FILENO) != 0) << "--progress=auto";

  // A synthetic worker needs a SIZE; everything else as by default.
  absl::FlagSaver restore;
  std::string error;
  ASSERT_TRUE(absl::FindCommandLineFlag("synthetic")->ParseFrom("1MiB", &error)) << error;
  ASSERT_TRUE(SyntheticRequested());
  absl::StatusOr<SyntheticOptions> synthetic = SyntheticOptionsFromFlags();
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  EXPECT_EQ(synthetic->model_bytes, 1 << 20);
  ExpectSame(AsFlags(*synthetic), AsFlags(SyntheticOptions()));
}

// A new flag is either one of a field, and checked above, or named in kNoField.
TEST(WorkerFlagsTest, EveryFlagIsCheckedOrFillsNoField) {
  std::set<std::string> checked = kNoField;
  for (const auto& f : AsFlags(WorkerOptions())) checked.insert(f.first);
  for (const auto& f : AsFlags(SyntheticOptions())) checked.insert(f.first);
  int ours = 0;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), "worker/flags.cc")) continue;
    ++ours;
    EXPECT_TRUE(checked.count(std::string(name)) > 0) << "--" << name << " is neither checked nor in kNoField";
  }
  EXPECT_EQ(ours, static_cast<int>(checked.size())) << "a name above is no flag of worker/flags.cc";
}

}  // namespace
}  // namespace summa::worker
