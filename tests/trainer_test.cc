// Trainer against an in-memory ParameterStore: where it resumes, how it re-shards when the group
// shrinks, how it rejoins after a lost or restarted server, and the epoch-end loss collective
// (its member rounds, the catch-up after a rejoin at an epoch's end, and its failures). Every
// check is on exact steps, example counts and calls, never on timing.
#include "worker/trainer.h"

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"
#include "client/parameter_store.h"
#include "worker/status_board.h"

namespace summa::worker {
namespace {

// A parameter server of one process: it keeps the weights, moves its version on with each push
// (applying nothing), and logs every call in order. Scripted failures replace the answer of the
// n-th call of a kind. Not thread-safe, except Heartbeat.
class FakeStore final : public ParameterStore {
 public:
  uint64_t next_step = 0;    // what the next Join answers (a push moves it on)
  std::vector<int> live;     // the group that Join and PushPull report
  std::map<uint64_t, std::vector<int>> live_after_step;  // the group a step's reply reports
  std::map<int, absl::Status> push_pull_fails;  // by PushPull call, 0-based
  // Backup workers: a step whose push comes late, and the step the others are at by then.
  std::map<uint64_t, uint64_t> late_to;
  std::map<int, absl::Status> reduce_fails;     // by AllReduce call of "summa.train.loss"
  std::vector<std::string> log;
  std::vector<std::string> device_gathers;  // the AllReduce calls of "summa.train.devices"
  int joins = 0;

  absl::StatusOr<JoinInfo> Join(int rank, int world, const std::vector<TensorSpec>& specs,
                                const float* initial, const std::string&) override {
    ++joins;
    int64_t floats = 0;
    for (const TensorSpec& s : specs) floats += s.num_elements();
    if (weights_.empty()) {
      weights_.assign(floats, 0.0f);
      if (initial != nullptr) weights_.assign(initial, initial + floats);
    }
    log.push_back(absl::StrCat("join ", rank, " of ", world));
    JoinInfo info;
    info.rank = rank < 0 ? 0 : rank;
    info.version = next_step;
    info.next_step = next_step;
    info.lease = absl::Seconds(60);
    info.live_ranks = live;
    return info;
  }
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, float* weights) override {
    std::copy(weights_.begin(), weights_.end(), weights);
    return next_step;
  }
  absl::StatusOr<uint64_t> PushPull(uint64_t step, int64_t num_examples, const float* gradients, float* weights,
                                    std::vector<int>* live_ranks) override {
    const int call = push_pulls_++;
    if (auto fail = push_pull_fails.find(call); fail != push_pull_fails.end()) {
      log.push_back(absl::StrCat("push ", step, " failed: ", absl::StatusCodeToString(fail->second.code())));
      return fail->second;
    }
    log.push_back(absl::StrCat("push ", step, " of ", num_examples));
    next_step = step + 1;
    if (auto late = late_to.find(step); late != late_to.end()) next_step = late->second;
    if (auto shrink = live_after_step.find(step); shrink != live_after_step.end()) live = shrink->second;
    std::copy(weights_.begin(), weights_.end(), weights);
    *live_ranks = live;
    return next_step;
  }
  absl::StatusOr<bool> Push(uint64_t step, int64_t num_examples, const float*) override {
    return absl::UnimplementedError("the trainer push-pulls");
  }
  absl::Status Heartbeat(int) const override { return absl::OkStatus(); }
  absl::Status Leave(int rank) override {
    log.push_back(absl::StrCat("leave ", rank));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> AllReduce(const Collective& group,
                                               const std::vector<float>& values) override {
    if (group.name == kDevicesCollective) {
      device_gathers.push_back(absl::StrCat("round ", group.round, " rank ", group.rank,
                                            group.members ? " members" : " fixed"));
      return values;  // the sum over a group of one
    }
    std::string entry = absl::StrCat("loss round ", group.round, " rank ", group.rank,
                                     group.members ? " members" : " fixed");
    if (values[0] == 0 && values[1] == 0) absl::StrAppend(&entry, " {0, 0}");
    const int call = reduces_++;
    if (auto fail = reduce_fails.find(call); fail != reduce_fails.end()) {
      log.push_back(absl::StrCat(entry, " failed: ", absl::StatusCodeToString(fail->second.code())));
      return fail->second;
    }
    log.push_back(entry);
    return values;  // the sum over a group of one
  }
  std::string address() const override { return "fake"; }

 private:
  std::vector<float> weights_;
  int push_pulls_ = 0;
  int reduces_ = 0;
};

// 8 examples of 28x28 in global batches of 4: 2 steps an epoch.
Dataset SmallData() {
  Dataset d;
  d.count = 8;
  d.rows = d.cols = 28;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> pixel(0, 1);
  d.images.resize(d.count * 28 * 28);
  for (float& p : d.images) p = pixel(rng);
  for (int i = 0; i < d.count; ++i) d.labels.push_back(i % 10);
  return d;
}

class TrainerTest : public ::testing::Test {
 protected:
  TrainerTest() : data_(SmallData()), backend_(NewCpuBackend(1)) {
    options_.model = "mlp";  // fast, and a model other than the default
    options_.rank = 0;
    options_.world_size = 1;
    options_.batch_size = 4;
    options_.epochs = 2;
    options_.evaluate = false;
    options_.retry_deadline = absl::Seconds(30);
    store_.live = {0};
    out_ = std::tmpfile();
  }
  ~TrainerTest() override { std::fclose(out_); }

  absl::Status Run() {
    Trainer trainer(options_, &data_, nullptr, {backend_.get()}, &store_, &board_, out_);
    absl::Status s = trainer.Run();
    results_ = trainer.results();
    return s;
  }
  std::string Output() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    char buf[512];
    while (std::fgets(buf, sizeof(buf), out_) != nullptr) text += buf;
    return text;
  }
  std::string Log() const { return absl::StrJoin(store_.log, "\n"); }

  Dataset data_;
  std::unique_ptr<Backend> backend_;
  TrainerOptions options_;
  FakeStore store_;
  StatusBoard board_;
  std::FILE* out_;
  std::vector<EpochResult> results_;
};

TEST_F(TrainerTest, TrainsEveryStepAndSumsEachEpochsLossOverTheMembers) {
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 of 4", "loss round 0 rank 0 members",
                                  "push 2 of 4", "push 3 of 4", "loss round 1 rank 0 members", "leave 0"},
                                 "\n"));
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_GT(results_[0].loss, 2.0);  // about ln 10 from the seed's small weights
  EXPECT_EQ(board_.Get().model, "mlp");
  EXPECT_NE(Output().find("rank 0 of 1 joined at step 0 (model mlp, sync mode)"), std::string::npos)
      << Output();
}

TEST_F(TrainerTest, ResumesAtTheStepTheJoinSays) {
  options_.epochs = 3;
  store_.next_step = 3;  // the middle of the second epoch
  ASSERT_TRUE(Run().ok()) << Output();
  // A process that joins a running job owes the last epoch's loss round nothing, and says so
  // (an elastic job's round may wait for it: it is in the group).
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "loss round 0 rank 0 members {0, 0}", "push 3 of 4",
                                  "loss round 1 rank 0 members",
                                  "push 4 of 4", "push 5 of 4", "loss round 2 rank 0 members", "leave 0"},
                                 "\n"));
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_EQ(results_[0].epoch, 2);
}

TEST_F(TrainerTest, TakesTheWholeBatchOnceTheOtherMemberIsDropped) {
  options_.rank = 1;
  options_.world_size = 2;
  store_.live = {0, 1};
  store_.live_after_step[1] = {1};  // rank 0 is dropped while step 1 completes
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 1 of 2", "push 0 of 2", "push 1 of 2", "loss round 0 rank 1 members",
                                  "push 2 of 4", "push 3 of 4", "loss round 1 rank 1 members", "leave 1"},
                                 "\n"));
}

TEST_F(TrainerTest, ALatePushSkipsToTheStepTheReplyNamesAndSaysSo) {
  options_.epochs = 3;  // 6 steps
  store_.late_to[0] = 1;  // late, but the others are only at the next step: nothing skipped
  store_.late_to[2] = 5;  // the others went on to the last epoch's second step
  ASSERT_TRUE(Run().ok()) << Output();
  // Epoch 1's second step is skipped, its loss round still summed (this rank's step 2), and
  // epoch 2 goes on from step 5.
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 of 4", "loss round 0 rank 0 members",
                                  "push 2 of 4", "loss round 1 rank 0 members", "push 5 of 4",
                                  "loss round 2 rank 0 members", "leave 0"},
                                 "\n"));
  EXPECT_NE(Output().find("rank 0: its push of step 2 came late (the step completed without it; --backup_workers) "
                          "and the job is at step 5: skipping 2 steps\n"),
            std::string::npos)
      << Output();
  EXPECT_EQ(Output().find("its push of step 0"), std::string::npos) << Output();
  EXPECT_EQ(board_.Get().step, 6u);
}

TEST_F(TrainerTest, RejoinsWhenTheServerIsLostAndGoesOn) {
  store_.push_pull_fails[1] = absl::UnavailableError("connection refused");
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 failed: UNAVAILABLE", "join 0 of 1",
                                  "push 1 of 4", "loss round 0 rank 0 members", "push 2 of 4",
                                  "push 3 of 4", "loss round 1 rank 0 members", "leave 0"},
                                 "\n"));
  EXPECT_NE(Output().find("rank 0 of 1 rejoined at step 1"), std::string::npos) << Output();
  EXPECT_EQ(board_.Get().joins, 2);
}

TEST_F(TrainerTest, GathersTheDevicesOnceAsTheMembersCollectiveOfRoundZero) {
  // A member collective: the server takes it only from the rank's session, and answers a
  // process that comes after the round (a second process of the rank) with its sum. As a fixed
  // group, such a process opened a round no one else entered (issue 33 item 4).
  store_.push_pull_fails[1] = absl::UnavailableError("connection refused");
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(absl::StrJoin(store_.device_gathers, "\n"), "round 0 rank 0 members");  // not again at the rejoin
  EXPECT_NE(Output().find("1 worker on [cpu]\n"), std::string::npos) << Output();
}

TEST_F(TrainerTest, RejoinsWhenARestartedServerHasForgottenIt) {
  store_.push_pull_fails[2] = absl::NotFoundError("rank 0 is not a member");
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 of 4", "loss round 0 rank 0 members",
                                  "push 2 failed: NOT_FOUND", "join 0 of 1",
                                  // Rejoined at an epoch's end: the catch-up, harmless here.
                                  "loss round 0 rank 0 members {0, 0}", "push 2 of 4",
                                  "push 3 of 4", "loss round 1 rank 0 members", "leave 0"},
                                 "\n"));
}

TEST_F(TrainerTest, JoiningAtAnEpochsEndFirstReleasesThatEpochsLossRound) {
  store_.next_step = 2;  // this member went away after the last step of epoch 0
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "loss round 0 rank 0 members {0, 0}", "push 2 of 4",
                                  "push 3 of 4", "loss round 1 rank 0 members", "leave 0"},
                                 "\n"));
  ASSERT_EQ(results_.size(), 1u);
}

TEST_F(TrainerTest, ACatchUpToARoundLongPastIsIgnored) {
  options_.epochs = 3;
  store_.next_step = 4;
  store_.reduce_fails[0] = absl::FailedPreconditionError("round 1 is past");
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "loss round 1 rank 0 members {0, 0} failed: FAILED_PRECONDITION",
                                  "push 4 of 4", "push 5 of 4", "loss round 2 rank 0 members", "leave 0"},
                                 "\n"));
}

TEST_F(TrainerTest, AServerLostDuringTheLossRoundIsRejoinedAndTheRoundCaughtUp) {
  store_.reduce_fails[0] = absl::UnavailableError("connection reset");
  ASSERT_TRUE(Run().ok()) << Output();
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 of 4",
                                  "loss round 0 rank 0 members failed: UNAVAILABLE", "join 0 of 1",
                                  "loss round 0 rank 0 members {0, 0}", "push 2 of 4", "push 3 of 4",
                                  "loss round 1 rank 0 members", "leave 0"},
                                 "\n"));
}

TEST_F(TrainerTest, AnEndedJobEndsTheWorkerWithAnError) {
  store_.reduce_fails[0] = absl::AbortedError("the job has finished");
  const absl::Status s = Run();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(Log(), absl::StrJoin({"join 0 of 1", "push 0 of 4", "push 1 of 4",
                                  "loss round 0 rank 0 members failed: ABORTED"},
                                 "\n"));
}

TEST_F(TrainerTest, AnyOtherLossRoundFailureFallsBackToTheLocalLoss) {
  store_.reduce_fails[0] = absl::DeadlineExceededError("a member is slow");
  ASSERT_TRUE(Run().ok()) << Output();
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_GT(results_[0].loss, 2.0);
  EXPECT_EQ(store_.log.back(), "leave 0");
}

TEST_F(TrainerTest, AnUnknownModelIsRefusedWithTheChoices) {
  options_.model = "resnet";
  const absl::Status s = Run();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("unknown model 'resnet' (choose one of lenet, mlp)"), std::string::npos) << s;
  EXPECT_TRUE(store_.log.empty());
}

}  // namespace
}  // namespace summa::worker
