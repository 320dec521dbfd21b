// server/checkpoint_tool/: summa-checkpoint's show and export over a sharded job's checkpoint
// directory (the K shards' files of the newest version all keep, assembled into the whole model)
// and over one shard's file (refused for export); and the core's side of safetensors that a live
// server uses: Export refused on a shard of several, --init_from's model check naming the first
// difference, and its values taken whatever the joiner sends; a job's embedding tables listed.
#include "server/checkpoint_tool/checkpoint_tool.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "common/row_hash.h"
#include "server/checkpoint/checkpoint_dir.h"
#include "tests/fake_call.h"
#include "tests/parameter_server_fixtures.h"

namespace summa::server {
namespace {

// Two ranks, w [4, 5] and b [3] (23 floats) in six partitions of at most 4 floats.
class CheckpointToolTest : public ::testing::Test {
 protected:
  CheckpointToolTest() {
    root_ = std::filesystem::temp_directory_path() / ("summa-ckpt-tool-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~CheckpointToolTest() override { std::filesystem::remove_all(root_); }

  ServerOptions Options(int shard, int shards) {
    ServerOptions o;
    o.require_sessions = false;
    o.world_size = 2;
    o.optimizer.learning_rate = 0.5;
    o.partition_bytes = 16;
    o.shard = shard;
    o.shards = shards;
    o.checkpoint_dir = root_ + "/job";
    o.checkpoint_every = 0;
    o.clock = &clock_;
    return o;
  }

  JoinRequestView Join(int rank, const std::vector<int64_t>& w_shape, bool values) {
    JoinRequestView v;
    v.rank = rank;
    v.world_size = 2;
    v.params = {{{"w", DType::kFloat32, w_shape}, values ? absl::string_view(w_) : absl::string_view()},
                {{"b", DType::kFloat32, {3}}, values ? absl::string_view(b_) : absl::string_view()}};
    return v;
  }

  // Both ranks push step `step` to every partition `ps` holds.
  void Step(ParameterServer& ps, const std::vector<PartitionRange>& held, uint64_t step) {
    for (const PartitionRange& r : held) {
      for (int rank : {0, 1}) {
        std::vector<float> g(r.length);
        for (int64_t k = 0; k < r.length; ++k) g[k] = std::sin(0.3f * static_cast<float>(step + rank) + 0.1f * (r.offset + k));
        const std::string bytes = Bytes(g);
        PushRequestView v;
        v.rank = rank;
        v.step = step;
        v.partition = r.id;
        v.num_examples = 1;
        v.data = bytes;
        ASSERT_TRUE(ps.Push(v).ok());
      }
    }
  }

  std::string root_;
  FakeClock clock_;
  const std::string w_ = Bytes({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f, 1.3f, 1.4f,
                                1.5f, 1.6f, 1.7f, 1.8f, 1.9f, 2.0f});
  const std::string b_ = Bytes({-1, -2, -3});
};

TEST_F(CheckpointToolTest, AShardedJobsDirectoryExportsTheWholeModelOfOneVersion) {
  std::vector<std::unique_ptr<ParameterServer>> shards;
  std::vector<std::vector<PartitionRange>> held(2);
  for (int i = 0; i < 2; ++i) {
    shards.push_back(std::make_unique<ParameterServer>(Options(i, 2)));
    for (int rank : {0, 1}) {
      absl::StatusOr<JoinResult> joined = shards[i]->Join(Join(rank, {4, 5}, rank == 0));
      ASSERT_TRUE(joined.ok()) << joined.status();
      held[i] = joined->partitions;
    }
  }
  for (uint64_t s = 0; s < 3; ++s) {
    for (int i = 0; i < 2; ++i) Step(*shards[i], held[i], s);
  }
  for (auto& shard : shards) ASSERT_TRUE(shard->MaybeCheckpoint(true).ok());
  const std::vector<float> at3 = ParameterServerPeer::JobWeights({shards[0].get(), shards[1].get()});
  // Shard 0 a step further: a version shard 1 does not keep, so the export is of version 3.
  Step(*shards[0], held[0], 3);
  ASSERT_TRUE(shards[0]->MaybeCheckpoint(true).ok());
  // A live shard refuses the Export call, naming the offline route.
  absl::StatusOr<ExportedModel> refused = shards[0]->Export(root_, "x.safetensors");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("summa-checkpoint export"), std::string::npos) << refused.status();

  const std::string out = root_ + "/model.safetensors";
  std::ostringstream printed;
  const absl::Status exported = ExportCheckpoint(root_ + "/job", out, printed);
  ASSERT_TRUE(exported.ok()) << exported << "\n" << printed.str();
  EXPECT_NE(printed.str().find("shard:      0 of 2"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("shard:      1 of 2"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("version:    3"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("tensors:    2 (23 parameters"), std::string::npos) << printed.str();
  auto reader = SafetensorsReader::Open(out);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().Specs(),
            (std::vector<TensorSpec>{{"w", DType::kFloat32, {4, 5}}, {"b", DType::kFloat32, {3}}}));
  absl::StatusOr<std::vector<float>> values = (*reader)->ReadAllFloat32();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, at3);
  const SafetensorsMetadata& metadata = (*reader)->header().metadata;
  EXPECT_NE(std::find(metadata.begin(), metadata.end(), std::make_pair(std::string("summa.step"), std::string("3"))),
            metadata.end());

  // One shard's file alone holds only its partitions.
  std::ostringstream ignored;
  const absl::Status one = ExportCheckpoint(CheckpointPath(ShardCheckpointDir(root_ + "/job", 1, 2), 3),
                                            root_ + "/one.safetensors", ignored);
  EXPECT_EQ(one.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(one.message().find("shard 1 of 2's checkpoint"), std::string::npos) << one;
  EXPECT_FALSE(std::filesystem::exists(root_ + "/one.safetensors"));
  // show: the header, every tensor with --tensors.
  std::ostringstream shown;
  ASSERT_TRUE(ShowCheckpoint(root_ + "/job", /*tensors=*/true, shown).ok());
  EXPECT_NE(shown.str().find("    w [4, 5]\n    b [3]\n"), std::string::npos) << shown.str();
  EXPECT_EQ(ShowCheckpoint(root_ + "/nothing", false, ignored).code(), absl::StatusCode::kNotFound);
}

// show lists a sharded job's embedding tables (name, dim, optimizer, rows on every shard,
// version) once it has read every file; export says their rows stay in the checkpoint.
TEST_F(CheckpointToolTest, AJobsEmbeddingTablesAreListedWithTheirRowsAndVersion) {
  summa::v1::EmbeddingTableSpec items;
  items.set_name("items");
  items.set_dim(4);
  items.mutable_optimizer()->set_name("adagrad");
  std::vector<std::unique_ptr<ParameterServer>> shards;
  std::vector<std::vector<PartitionRange>> held(2);
  for (int i = 0; i < 2; ++i) {
    shards.push_back(std::make_unique<ParameterServer>(Options(i, 2)));
    for (int rank : {0, 1}) {
      JoinRequestView v = Join(rank, {4, 5}, rank == 0);
      v.tables = {items};
      absl::StatusOr<JoinResult> joined = shards[i]->Join(v);
      ASSERT_TRUE(joined.ok()) << joined.status();
      held[i] = joined->partitions;
    }
  }
  for (uint64_t s = 0; s < 2; ++s) {
    for (int i = 0; i < 2; ++i) {
      for (int rank : {0, 1}) {
        SparsePullView pull;
        pull.rank = rank;
        pull.min_version = s;
        for (uint64_t id = 0; id < 10; ++id) {
          if (RowShard(id, 2) == i) pull.ids.push_back(id);
        }
        const std::vector<uint64_t> ids = pull.ids;
        auto call = std::make_shared<FakeCall>();
        shards[i]->SparsePull(std::move(pull), call);
        ASSERT_TRUE(call->Wait().ok());
        const std::vector<float> grads(ids.size() * 4, 0.5f);
        SparsePushView push;
        push.rank = rank;
        push.step = s;
        push.num_examples = 1;
        push.ids = ids;
        push.grads = grads;
        ASSERT_TRUE(shards[i]->SparsePush(push).ok());
      }
      Step(*shards[i], held[i], s);
    }
  }
  for (auto& shard : shards) ASSERT_TRUE(shard->MaybeCheckpoint(true).ok());
  std::ostringstream shown;
  const absl::Status ok = ShowCheckpoint(root_ + "/job", /*tensors=*/false, shown);
  ASSERT_TRUE(ok.ok()) << ok << "\n" << shown.str();
  EXPECT_NE(shown.str().find("  tables:     1 embedding table (10 rows)\n    items: dim 4, adagrad, 10 rows, version 2\n"),
            std::string::npos)
      << shown.str();
  std::ostringstream exported;
  ASSERT_TRUE(ExportCheckpoint(root_ + "/job", root_ + "/model.safetensors", exported).ok());
  EXPECT_NE(exported.str().find("the checkpoint's 1 embedding table not exported: their rows stay in the checkpoint"),
            std::string::npos)
      << exported.str();
}

TEST_F(CheckpointToolTest, InitFromChecksTheFirstJoinByNameAndTakesTheFilesValues) {
  ServerOptions o = Options(0, 1);
  o.checkpoint_dir = "";
  const std::vector<float> file_values = [] {
    std::vector<float> v(23);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 100.0f + static_cast<float>(i);
    return v;
  }();
  auto initial = [&] {
    return InitialWeights{"lenet.safetensors", {{"w", DType::kFloat32, {4, 5}}, {"b", DType::kFloat32, {3}}}, file_values};
  };
  struct Case {
    std::vector<TensorSpec> model;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{"w", DType::kFloat32, {5, 4}}, {"b", DType::kFloat32, {3}}},
       "w: shape [4, 5] in lenet.safetensors, [5, 4] in the model"},
      {{{"w", DType::kFloat32, {4, 5}}}, "b: in lenet.safetensors, not in the model"},
      {{{"w", DType::kFloat32, {4, 5}}, {"b", DType::kFloat32, {3}}, {"c", DType::kFloat32, {1}}},
       "c: in the model, not in lenet.safetensors"},
      {{{"b", DType::kFloat32, {3}}, {"w", DType::kFloat32, {4, 5}}},
       "tensor 0 is b in the model and w in lenet.safetensors: the order differs"},
  };
  for (const Case& c : cases) {
    ParameterServer ps(o);
    ASSERT_TRUE(ps.StartFrom(initial()).ok());
    JoinRequestView v;
    v.rank = 0;
    v.world_size = 2;
    v.values_follow = true;
    for (const TensorSpec& spec : c.model) v.params.push_back({spec, absl::string_view()});
    const absl::StatusOr<JoinResult> joined = ps.Join(v);
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kFailedPrecondition) << c.says;
    EXPECT_NE(joined.status().message().find(c.says), std::string::npos) << joined.status();
    EXPECT_FALSE(ps.Status().model_defined);
  }
  // The joiner's values (or none) give way to the file's, at version 0.
  for (bool values : {true, false}) {
    ParameterServer ps(o);
    ASSERT_TRUE(ps.StartFrom(initial()).ok());
    absl::StatusOr<JoinResult> joined = ps.Join(Join(0, {4, 5}, values));
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_FALSE(joined->initialize);
    EXPECT_EQ(joined->version, 0u);
    EXPECT_EQ(Weights(ps), file_values);
    EXPECT_EQ(ps.StartFrom(initial()).code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace summa::server
