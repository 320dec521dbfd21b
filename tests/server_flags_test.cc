// summa-server's flags (server/flags.cc) against the options they fill: each flag's default is its
// field's default in a default-constructed struct, and the default flags give the default options,
// so that `summa-server` and a test's `ServerOptions()` run the same job.
#include "server/flags.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "common/byte_size.h"
#include "common/compression.h"
#include "gtest/gtest.h"

namespace summa::server {
namespace {

template <typename T>
std::string Text(const T& value) {
  return absl::UnparseFlag<T>(value);
}

// Every flag that fills a field, with that field's value in `o` as the flag would spell it.
std::vector<std::pair<std::string, std::string>> AsFlags(const ServerOptions& o) {
  const OptimizerOptions& opt = o.optimizer;
  const LimitOptions& l = o.limits;
  return {
      {"workers", Text(o.world_size)},
      {"mode", ModeName(o.mode)},
      {"staleness", Text(o.staleness)},
      {"backup_workers", Text(o.backup_workers)},
      {"sync_every", Text(o.sync_every)},
      {"lease", Text(o.lease)},
      {"on_worker_loss", OnWorkerLossName(o.on_worker_loss)},
      {"rejoin_deadline", Text(o.rejoin_deadline)},
      {"checkpoint_dir", o.checkpoint_dir},
      {"checkpoint_every", Text(o.checkpoint_every)},
      {"keep_checkpoints", Text(o.keep_checkpoints)},
      {"export_dir", o.export_dir},
      {"export", o.export_path},
      {"init_from", o.init_from},
      {"optimizer", opt.name},
      {"lr", Text(opt.learning_rate)},
      {"momentum", Text(opt.momentum)},
      {"nesterov", Text(opt.nesterov)},
      {"weight_decay", Text(opt.weight_decay)},
      {"beta1", Text(opt.beta1)},
      {"beta2", Text(opt.beta2)},
      {"eps", Text(opt.eps)},
      {"lr_schedule", LrScheduleName(opt.schedule)},
      {"lr_step_size", Text(opt.step_size)},
      {"lr_gamma", Text(opt.gamma)},
      {"lr_warmup_steps", Text(opt.warmup_steps)},
      {"lr_total_steps", Text(opt.total_steps)},
      {"nonfinite", NonFiniteName(o.nonfinite)},
      {"deterministic", Text(o.deterministic)},
      {"wire_dtype", std::string(WireDTypeName(o.wire_dtype))},
      {"compress", CompressionName(o.compression)},
      {"partition_bytes", Text(o.partition_bytes)},
      {"shards", Text(o.shards)},
      {"shard", Text(o.shard)},
      {"barrier_deadline", Text(o.barrier_deadline)},
      {"require_sessions", Text(o.require_sessions)},
      {"max_message_bytes", FormatByteSize(l.max_message_bytes)},
      {"max_model_bytes", FormatByteSize(l.max_model_bytes)},
      {"max_table_bytes", FormatByteSize(l.max_table_bytes)},
      {"max_parked_calls", Text(l.max_parked_calls)},
      {"max_parked_calls_per_peer", Text(l.max_parked_calls_per_peer)},
      {"max_collectives", Text(l.max_collectives)},
      {"max_open_collectives_per_peer", Text(l.max_open_collectives_per_peer)},
      {"max_allreduce_bytes", FormatByteSize(l.max_allreduce_bytes)},
      {"max_bytes_in_flight_per_peer", FormatByteSize(l.max_bytes_in_flight_per_peer)},
      {"join_rate", Text(l.join_rate)},
      {"max_data_plane_connections", Text(l.max_data_plane_connections)},
      {"max_data_plane_connections_in_hello", Text(l.max_data_plane_connections_in_hello)},
      {"max_data_plane_connections_in_hello_per_source", Text(l.max_data_plane_connections_in_hello_per_source)},
      {"data_plane_hello_timeout", Text(l.data_plane_hello_timeout)},
  };
}

std::vector<std::pair<std::string, std::string>> AsFlags(const TlsFiles& tls, const TokenFiles& tokens,
                                                         const Coordinator& c) {
  return {{"tls_cert", tls.cert},
          {"tls_key", tls.key},
          {"tls_ca", tls.ca},
          {"token_file", tokens.worker},
          {"admin_token_file", tokens.admin},
          {"token_grace_period", Text(tokens.grace)},
          {"status_needs_token", Text(tokens.status_needs_token)},
          {"coordinator", c.address}};
}

// Flags whose default stands for something no field can hold, and what it is.
const std::vector<std::pair<std::string, std::string>> kSentinels = {
    {"shard", "-1"},  // find the shard: 0 unsharded, else $HOSTNAME's ordinal
    {"sync_every", Text(DilocoDefaults().sync_every)},  // H under --mode=diloco; the field's 0 is "not DiLoCo"
};

// Flags that fill no options struct: the listeners main starts (SummaServer::Start's arguments,
// all but --address empty by default there too).
const std::set<std::string> kNoField = {
    "address",        "port_file",        "metrics_address", "metrics_port_file", "health_address",
    "health_port_file", "data_address",   "data_port_file",  "shm_socket",      "trace_file",
    // --mode=diloco's outer optimizer: they fill `optimizer` then, in place of its own flags.
    "outer_optimizer", "outer_lr", "outer_momentum"};

std::string DefaultOf(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  EXPECT_NE(flag, nullptr) << "--" << name << " is not a flag of summa-server";
  return flag != nullptr ? flag->DefaultValue() : "";
}

std::string SentinelOf(const std::string& name) {
  for (const auto& [flag, value] : kSentinels) {
    if (flag == name) return value;
  }
  return "";
}

TEST(ServerFlagsTest, EachFlagDefaultsToItsFieldsDefault) {
  std::vector<std::pair<std::string, std::string>> fields = AsFlags(ServerOptions());
  for (auto& f : AsFlags(TlsFiles(), TokenFiles(), Coordinator())) fields.push_back(f);
  for (const auto& [name, field] : fields) {
    const std::string sentinel = SentinelOf(name);
    EXPECT_EQ(DefaultOf(name), sentinel.empty() ? field : sentinel)
        << "--" << name << ": the flag's default is not its field's (" << field << ")";
  }
}

TEST(ServerFlagsTest, TheDefaultFlagsGiveTheDefaultOptions) {
  ::unsetenv("HOSTNAME");  // unsharded, --shard's default is shard 0 whatever the host
  absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  const std::vector<std::pair<std::string, std::string>> got = AsFlags(*options), want = AsFlags(ServerOptions());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second, want[i].second) << "--" << got[i].first << " by default";
  }
  absl::StatusOr<EndpointSecurity> security = SecurityFromFlags();
  ASSERT_TRUE(security.ok()) << security.status();
  absl::StatusOr<Coordinator> coordinator = CoordinatorFromFlags();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_EQ(AsFlags(security->tls, TokenFilesFromFlags(), *coordinator),
            AsFlags(TlsFiles(), TokenFiles(), Coordinator()));
  EXPECT_FALSE(security->tokens.any());
}

// Sets flags from "name=value" items for the scope of the FlagSaver the caller holds.
void SetFlags(const std::vector<std::string>& items) {
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(item.substr(0, eq));
    ASSERT_NE(flag, nullptr) << item;
    std::string error;
    ASSERT_TRUE(flag->ParseFrom(item.substr(eq + 1), &error)) << item << ": " << error;
  }
}

TEST(ServerFlagsTest, DilocoTakesTheOuterOptimizerAndRefusesTheServersOwn) {
  ::unsetenv("HOSTNAME");
  {
    absl::FlagSaver restore;
    SetFlags({"mode=diloco"});
    absl::StatusOr<ServerOptions> o = ServerOptionsFromFlags();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->mode, Mode::kSync);
    EXPECT_EQ(o->sync_every, DilocoDefaults().sync_every);
    EXPECT_EQ(o->optimizer.name, "sgd");
    EXPECT_EQ(o->optimizer.learning_rate, DilocoDefaults().outer_lr);
    EXPECT_EQ(o->optimizer.momentum, DilocoDefaults().outer_momentum);
    EXPECT_TRUE(o->optimizer.nesterov);
    EXPECT_EQ(o->checkpoint_every, 1) << "an outer step is H local steps of every worker";
  }
  {
    absl::FlagSaver restore;
    SetFlags({"mode=diloco-async", "sync_every=10", "outer_optimizer=sgd", "outer_lr=1", "outer_momentum=0"});
    absl::StatusOr<ServerOptions> o = ServerOptionsFromFlags();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->mode, Mode::kAsync);
    EXPECT_EQ(o->sync_every, 10);
    EXPECT_EQ(o->optimizer.learning_rate, 1.0);
    EXPECT_FALSE(o->optimizer.nesterov);
    EXPECT_EQ(JobModeName(*o), "diloco-async");
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"mode=diloco", "lr=0.5"}, "--lr with --mode=diloco"},
      {{"mode=diloco", "weight_decay=0.1"}, "--weight_decay with --mode=diloco"},
      {{"mode=diloco", "sync_every=0"}, "--sync_every=0"},
      {{"mode=diloco", "outer_optimizer=adam"}, "unknown --outer_optimizer 'adam'"},
      {{"mode=diloco", "outer_momentum=0"}, "nesterov needs --outer_momentum > 0"},
      {{"sync_every=10"}, "--sync_every is for --mode=diloco"},
      {{"outer_lr=0.5"}, "--outer_lr is for --mode=diloco"},
      {{"mode=diloco", "backup_workers=1", "workers=2"}, "--backup_workers=1 with --mode=diloco"},
      {{"mode=dilo"}, "use sync, async, ssp, diloco or diloco-async"},
      {{"mode=diloco", "wire_dtype=fp16"}, "past fp16's range"},
  };
  for (const auto& [flags, why] : refused) {
    absl::FlagSaver restore;
    SetFlags(flags);
    absl::StatusOr<ServerOptions> o = ServerOptionsFromFlags();
    EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << flags[0] << ": " << o.status();
    EXPECT_TRUE(absl::StrContains(o.status().message(), why)) << o.status();
  }
}

// The token flags are checked at start: a bad line of --token_file named by file and line, a
// negative grace period, a shard coordinator whose --token_file has no bare token to call with.
TEST(ServerFlagsTest, TokenFilesAreCheckedAtStart) {
  ::unsetenv("HOSTNAME");
  const std::string dir = ::testing::TempDir() + "/server_flags_test_tokens_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/bad") << "# the job's\nbare\nzero rank=zero\n";
  std::ofstream(dir + "/scoped") << "zero rank=0\none rank=1\n";
  {
    absl::FlagSaver restore;
    SetFlags({"token_file=" + dir + "/bad"});
    const absl::Status s = SecurityFromFlags().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "--token_file " + dir + "/bad line 3: rank=zero is not a rank (a whole number, 0 or more; "
                           "a bare token speaks for any rank)");
  }
  {
    absl::FlagSaver restore;
    SetFlags({"token_file=" + dir + "/scoped", "token_grace_period=-1s"});
    EXPECT_EQ(SecurityFromFlags().status().message(), "--token_grace_period must be 0 or more, got -1s");
  }
  {
    absl::FlagSaver restore;
    SetFlags({"token_file=" + dir + "/scoped", "coordinator=127.0.0.1:1"});
    absl::StatusOr<EndpointSecurity> security = SecurityFromFlags();
    ASSERT_TRUE(security.ok()) << security.status();
    EXPECT_TRUE(security->tokens.any());
    EXPECT_EQ(CoordinatorFromFlags().status().message(),
              "--coordinator: --token_file " + dir + "/scoped lists no bare token: a shard calls shard 0 "
              "(--coordinator) for the whole job, which a token scoped to one rank (rank=) cannot do");
  }
}

// A new flag is either one of a field, and checked above, or named in kNoField.
TEST(ServerFlagsTest, EveryFlagIsCheckedOrFillsNoField) {
  std::set<std::string> checked = kNoField;
  for (const auto& f : AsFlags(ServerOptions())) checked.insert(f.first);
  for (const auto& f : AsFlags(TlsFiles(), TokenFiles(), Coordinator())) checked.insert(f.first);
  int ours = 0;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), "server/flags.cc")) continue;
    ++ours;
    EXPECT_TRUE(checked.count(std::string(name)) > 0) << "--" << name << " is neither checked nor in kNoField";
  }
  EXPECT_EQ(ours, static_cast<int>(checked.size())) << "a name above is no flag of server/flags.cc";
}

}  // namespace
}  // namespace summa::server
