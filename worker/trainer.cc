#include "worker/trainer.h"

#include <algorithm>
#include <optional>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "worker/models/pipeline.h"
#include "worker/sharding.h"

namespace summa::worker {

Trainer::Trainer(TrainerOptions options, const Dataset* train, const Dataset* test,
                 std::vector<Backend*> backends, ParameterStore* store, StatusBoard* board,
                 std::FILE* out)
    : options_(std::move(options)),
      train_(train),
      test_(test),
      backends_(std::move(backends)),
      store_(store),
      board_(board),
      out_(out),
      leases_(store) {}

Trainer::~Trainer() = default;

absl::Status Trainer::Prepare(int max_shard) {
  if (backends_.empty()) return absl::InvalidArgumentError("the trainer needs at least one device");
  if (options_.model_parallel == 2) {
    // One model over both devices: to the rest of the trainer, one device's model.
    if (backends_.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("--model_parallel=2 splits the model across two devices; ",
                                                     backends_.size(), " given (--devices=cpu,cpu or cuda:0,cuda:1)"));
    }
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           NewPipelinedModel(options_.model, backends_[0], backends_[1], std::max(1, max_shard),
                                             options_.micro_batches));
    models_.push_back(std::move(model));
  } else if (options_.model_parallel != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_parallel must be 1 or 2, got ", options_.model_parallel));
  }
  const int devices = static_cast<int>(models_.empty() ? backends_.size() : models_.size());
  // Replaying an elastic job's groups, a step may split its shard over fewer devices than all.
  const int per_device = options_.replay_groups.empty() ? (max_shard + devices - 1) / devices : max_shard;
  for (int d = 0; models_.size() < static_cast<size_t>(devices); ++d) {
    Backend* const b = backends_[d];
    SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           NewModel(options_.model, b, std::max(1, per_device), b->preferred_chunk()));
    models_.push_back(std::move(model));
  }
  const Model& model = *models_[0];
  if (int64_t{train_->rows} * train_->cols != model.image_floats()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", model.name(), " needs images of ",
                                                   model.image_floats(), " floats; the training set's are ",
                                                   train_->rows, "x", train_->cols));
  }
  Backend& first = *backends_[0];
  const int64_t params = model.num_params();
  SUMMA_ASSIGN_OR_RETURN(weights_, first.AllocHost(params));
  SUMMA_ASSIGN_OR_RETURN(gradients_, first.AllocHost(params));
  max_shard_ = max_shard;
  device_threads_ = std::make_unique<DeviceThreads>(devices);
  SUMMA_RETURN_IF_ERROR(PrepareResident());
  if (devices > 1) {
    SUMMA_ASSIGN_OR_RETURN(peer_gradients_, first.Alloc(params));
  }
  return absl::OkStatus();
}

// Every worker's device, gathered with the server's AllReduce: each rank writes a code into its
// own slot (1 for cpu, 2 + g for cuda:g).
absl::StatusOr<std::vector<std::string>> Trainer::DeviceNames() {
  // Two slots per rank: the first device's code, and how many devices the rank drives.
  std::vector<float> slots(2 * options_.world_size, 0.0f);
  const std::string mine = backends_[0]->name();
  int gpu = 0;
  if (mine != "cpu" && !(absl::StartsWith(mine, "cuda:") && absl::SimpleAtoi(mine.substr(5), &gpu))) {
    return absl::InvalidArgumentError(absl::StrCat("device name '", mine, "' is neither cpu nor cuda:N"));
  }
  // An elastic job's grower (a rank at or above --world_size) has no slot: it contributes zeros,
  // so that a round its membership makes wait for it completes, and its device goes unnamed.
  if (rank_ < options_.world_size) {
    slots[2 * rank_] = mine == "cpu" ? 1.0f : 2.0f + gpu;
    slots[2 * rank_ + 1] = static_cast<float>(backends_.size());
  }
  // A member collective, round 0: the server takes it only from the rank's current session, and a
  // process that joins after the round completed (a second process of a rank, which fenced the
  // first after that one had contributed) is answered with the round's sum. As a fixed group it
  // opened a round of its own, which no one else would enter, and waited there for the barrier
  // deadline while the others waited for its first push (issue 33 item 4).
  Collective group;
  group.name = kDevicesCollective;
  group.group_size = options_.world_size;
  group.rank = rank_;
  group.members = true;
  group.round = 0;
  // Names for the epoch lines only: not worth a wait. A process whose first join comes after a
  // server restart (which keeps no collectives) would open round 0 alone and wait there.
  group.timeout = absl::Seconds(5);
  SUMMA_ASSIGN_OR_RETURN(std::vector<float> all, store_->AllReduce(group, slots));
  std::vector<std::string> names;
  for (int r = 0; r < options_.world_size; ++r) {
    const float code = all[2 * r];
    const int count = static_cast<int>(all[2 * r + 1]);
    // 0: a rank out of the group before it contributed (dropped under shrink).
    std::string name = code == 0.0f   ? "?"
                       : code == 1.0f ? "cpu"
                                      : absl::StrCat("cuda:", static_cast<int>(code) - 2);
    if (count > 1) absl::StrAppend(&name, " x", count);
    names.push_back(name);
  }
  return names;
}

std::string Trainer::DevicesOf(const std::vector<int>& ranks) const {
  if (device_names_.empty()) return absl::StrCat("[", backends_[0]->name(), " ...]");
  std::vector<std::string> names;
  for (int r : ranks) {
    // A rank that joined after the names were gathered (an elastic job's) has none.
    names.push_back(r < static_cast<int>(device_names_.size()) ? device_names_[r] : "?");
  }
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

void Trainer::DrawProgress(int epoch, int64_t done, int64_t total, double rate) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::fprintf(out_, "\repoch %d/%d [%s%s] %3d%% %8.0f examples/s", epoch, options_.epochs,
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               static_cast<int>(total == 0 ? 100 : 100 * done / total), rate);
  std::fflush(out_);
}

absl::Status Trainer::Run() {
  const int64_t batch = options_.batch_size;
  if (batch < options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("global batch ", batch, " is smaller than the ",
                                                   options_.world_size, " workers sharing it"));
  }
  // Sized for the whole batch: when `shrink` drops members, the rest take larger shards.
  SUMMA_RETURN_IF_ERROR(Prepare(static_cast<int>(batch)));
  board_->Update([&](WorkerState& s) {
    s.state = "joining";
    s.world_size = options_.world_size;
    s.epochs = options_.epochs;
    s.device = backends_[0]->name();
    for (size_t d = 1; d < backends_.size(); ++d) absl::StrAppend(&s.device, ",", backends_[d]->name());
    s.server = store_->address();
    s.model = options_.model;
  });
  initial_weights_ = models_[0]->InitialWeights(options_.seed);
  absl::Status result;
  absl::Time failing_since = absl::InfiniteFuture();
  uint64_t steps_at_failure = 0;
  absl::Duration backoff = absl::Milliseconds(200);
  for (int attempt = 0;; ++attempt) {
    result = JoinAndTrain(initial_weights_, attempt > 0);
    if (overlap_ != nullptr) overlap_->Abandon();  // a step in flight when it failed
    if (result.ok()) break;
    const absl::Time now = absl::Now();
    const uint64_t done = steps_done_ + (overlap_ != nullptr ? overlap_->steps_finished() : 0);
    if (failing_since == absl::InfiniteFuture() || done != steps_at_failure) {
      failing_since = now;
      steps_at_failure = done;
      backoff = absl::Milliseconds(200);
    }
    if (IsStaleView(result) && rank_ >= 0 && now - failing_since <= options_.retry_deadline) {
      // A member left the group during a step this rank pushed, and the step starts again under
      // the group left: join again (the same rank), and compute this rank's new share of the
      // same batch. Bounded as a lost server is, by --retry_deadline without a step done.
      if (options_.progress_bar) std::fprintf(out_, "\r\033[K");
      std::fprintf(out_, "rank %d: the group changed under a step it had pushed (a member left during it); "
                   "joining again to compute its share of the step over the new group\n", rank_);
      std::fflush(out_);
      continue;
    }
    // The server went away (UNAVAILABLE) or came back without us (NOT_FOUND): rejoin, and resume
    // at the version it has (a restored checkpoint's, or the one we were at).
    if (!absl::IsUnavailable(result) && !absl::IsNotFound(result)) break;
    if (rank_ < 0) break;  // never joined: Join already retried for --join_deadline
    if (now - failing_since > options_.retry_deadline) {
      result = absl::Status(result.code(), absl::StrCat("gave up after ", absl::FormatDuration(now - failing_since),
                                                        " of retries: ", result.message()));
      break;
    }
    if (options_.progress_bar) std::fprintf(out_, "\r\033[K");
    std::fprintf(out_, "rank %d lost the server (%s); rejoining in %s\n", rank_,
                 std::string(result.message()).c_str(), absl::FormatDuration(backoff).c_str());
    std::fflush(out_);
    board_->Update([](WorkerState& s) { s.state = "rejoining"; });
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(3));
  }
  leases_.Stop();
  if (!result.ok()) return result;
  if (rank_ >= 0) store_->Leave(rank_).IgnoreError();  // the group goes on without us
  board_->Update([](WorkerState& s) { s.state = "done"; });
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Trainer::EpochLoss(int epoch, double loss_sum, int64_t examples) {
  // The mean loss over the group's examples: the seed's allreduce, through the server, over the
  // members still in the group. group_size and rank also make it a fixed collective of the
  // whole world for a server that predates member collectives.
  Collective group;
  group.name = kLossCollective;
  group.rank = rank_;
  group.group_size = options_.world_size;
  group.members = true;
  group.round = static_cast<uint64_t>(epoch);
  const std::vector<float> mine = {static_cast<float>(loss_sum), static_cast<float>(examples)};
  absl::StatusOr<std::vector<float>> totals = store_->AllReduce(group, mine);
  if (totals.ok()) return totals;
  if (absl::IsUnavailable(totals.status())) return totals.status();  // rejoin
  if (absl::IsAborted(totals.status())) {
    return absl::AbortedError(absl::StrCat("the job ended while epoch ", epoch + 1,
                                           "'s loss was being summed: ", totals.status().message()));
  }
  // Anything else (a deadline, say) must not stall the report: fall back to this shard's loss.
  return mine;
}

absl::Status Trainer::PlanOverlap(const JoinInfo& joined) {
  ParameterClient* const client = store_->staged_client();
  // A top-k push (--compress) takes the whole gradient at once, and a model on several devices
  // has its gradient only once theirs are summed: nothing to overlap. A 16-bit wire
  // (--wire_dtype) encodes each partition as it goes.
  // With backup workers a reply may move the step on past the next one, whose forward an
  // overlapped step has begun already: those steps follow their exchange.
  overlapping_ = options_.overlap && client != nullptr && models_.size() == 1 && models_[0]->weights() != nullptr &&
                 !joined.compression.sparse() &&
                 joined.backup_workers == 0 && joined.sync_every == 0;
  if (!overlapping_) return absl::OkStatus();
  if (overlap_ == nullptr) {
    overlap_ = std::make_unique<LayerExchange>(client, models_[0].get(), backends_[0], weights_->data(),
                                               gradients_->data(), options_.tracer);
  }
  return overlap_->Plan();
}

namespace {

// Host memory of another owner's (the store's shared values), as a DeviceBuffer.
class HostView final : public DeviceBuffer {
 public:
  HostView(float* data, int64_t size) : DeviceBuffer(data, size) {}
};

}  // namespace

absl::Status Trainer::ShareGradients() {
  // Once, before anything holds the buffer's address (the overlap's LayerExchange takes it).
  if (gradients_asked_ || overlap_ != nullptr || !backends_[0]->host_memory()) return absl::OkStatus();
  gradients_asked_ = true;
  SUMMA_ASSIGN_OR_RETURN(float* const shared, store_->SharedValues(static_cast<size_t>(gradients_->size())));
  if (shared == nullptr) return absl::OkStatus();
  std::copy(gradients_->data(), gradients_->data() + gradients_->size(), shared);
  gradients_ = std::make_unique<HostView>(shared, gradients_->size());
  SUMMA_LOG(INFO) << "gradients are pushed where they lie, in the shared-memory plane's values segment";
  return absl::OkStatus();
}

absl::Status Trainer::JoinAndTrain(const std::vector<float>& initial, bool rejoining) {
  const int64_t n = train_->count;
  const int64_t batch = options_.batch_size;
  const int rank_wanted = rank_ >= 0 ? rank_ : options_.rank;
  SUMMA_ASSIGN_OR_RETURN(JoinInfo joined,
                         store_->Join(rank_wanted, options_.world_size, models_[0]->specs(),
                                       rank_wanted <= 0 ? initial.data() : nullptr,
                                       options_.status_address));
  rank_ = joined.rank;
  live_ = joined.live_ranks;
  mode_ = joined.mode == summa::v1::MODE_ASYNC ? "async mode"
          : joined.mode == summa::v1::MODE_SSP ? absl::StrCat("ssp mode, staleness ", joined.staleness)
                                                : "sync mode";
  if (joined.wire_dtype != WireDType::kFloat32) absl::StrAppend(&mode_, ", ", WireDTypeName(joined.wire_dtype), " on the wire");
  if (joined.compression.sparse()) absl::StrAppend(&mode_, ", ", CompressionName(joined.compression));
  if (joined.backup_workers > 0) {
    absl::StrAppend(&mode_, ", ", joined.backup_workers, " backup worker", joined.backup_workers == 1 ? "" : "s");
  }
  if (rejoining && joined.sync_every != sync_every_) {
    // A server restarted into another job (no checkpoint, another --mode or H): this worker's
    // place in the data and its local steps belong to the job it joined first.
    return absl::FailedPreconditionError(absl::StrCat(
        "the server's job changed under this worker: it had ", sync_every_, " local steps between exchanges (DiLoCo) "
        "and now has ", joined.sync_every, " (a server restarted with another --mode or --sync_every and no checkpoint)"));
  }
  sync_every_ = joined.sync_every;
  if (sync_every_ > 0) {
    if (local_ == nullptr) {
      SUMMA_ASSIGN_OR_RETURN(local_, LocalOptimizer::Create(options_.inner, models_[0]->num_params()));
    }
    mode_ = absl::StrCat(joined.mode == summa::v1::MODE_SYNC ? "diloco" : "diloco-async", " mode, ", sync_every_,
                         " local steps of ", local_->Describe(), " between exchanges");
  }
  leases_.Start(rank_, joined.lease);
  SUMMA_ASSIGN_OR_RETURN(const uint64_t pulled, store_->PullAll(joined.version, weights_->data()));
  SUMMA_RETURN_IF_ERROR(LoadWeights());
  SUMMA_RETURN_IF_ERROR(ShareGradients());
  SUMMA_RETURN_IF_ERROR(PlanOverlap(joined));
  uint64_t step = joined.next_step;
  // With backup workers the others need not wait for this rank: its weights may be of a later
  // step than the one its Join named, and it goes on from that one.
  if (joined.backup_workers > 0 && joined.mode == summa::v1::MODE_SYNC) step = std::max(step, pulled);
  // The server's steps per epoch: every batch's, or DiLoCo's exchanges, the last of an epoch
  // over the batches left (an epoch ends on the outer weights).
  const int64_t batches_per_epoch = StepsPerEpoch(n, batch);
  const int64_t steps_per_epoch = sync_every_ > 0 ? (batches_per_epoch + sync_every_ - 1) / sync_every_ : batches_per_epoch;
  if (step >= static_cast<uint64_t>(steps_per_epoch) && (step % steps_per_epoch == 0 || !rejoining)) {
    // This member went away at an epoch's end (a crash, a lost server), or joins a running job
    // (an elastic job's new member, from the step it was admitted at), so it may owe the last
    // epoch's loss round, which the others may be waiting in: contribute nothing to release them.
    // A round already past says so (FAILED_PRECONDITION), as may a restarted server that has no
    // such round (OUT_OF_RANGE): the courtesy is then moot, and training goes on. A lost server
    // or an ended job is not ignored.
    Collective loss_round;
    loss_round.name = kLossCollective;
    loss_round.rank = rank_;
    loss_round.group_size = options_.world_size;
    loss_round.members = true;
    loss_round.round = step / steps_per_epoch - 1;
    absl::Status caught_up = store_->AllReduce(loss_round, {0.0f, 0.0f}).status();
    if (absl::IsUnavailable(caught_up) || absl::IsNotFound(caught_up) || absl::IsAborted(caught_up)) {
      return caught_up;
    }
  }
  if (device_names_.empty() && !rejoining) {
    // Every process's first join, at step 0 or later: a member collective's round waits for every
    // member, a joiner of a running job included (it gets the round's sum when the round just
    // completed; one long past refuses it, FAILED_PRECONDITION, and the names stay unknown).
    absl::StatusOr<std::vector<std::string>> names = DeviceNames();
    if (names.ok()) {
      device_names_ = *std::move(names);
    } else if (!absl::IsFailedPrecondition(names.status()) && !absl::IsDeadlineExceeded(names.status())) {
      // The epoch line says "[cpu ...]"; a lost server or an ended job shows at the next call.
      SUMMA_LOG(WARNING) << "the group's devices are not known: " << names.status();
    }
  }
  std::fprintf(out_, "rank %d of %d %s at step %llu (model %s, %s%s)\n", rank_, options_.world_size,
               rejoining ? "rejoined" : "joined", static_cast<unsigned long long>(step),
               options_.model.c_str(), mode_.c_str(), overlapping_ ? ", overlapped" : "");
  std::fflush(out_);
  board_->Update([&](WorkerState& s) {
    s.rank = rank_;
    s.step = step;
    s.mode = mode_;
    s.joins += 1;
    s.state = "training";
  });

  const int64_t params = models_[0]->num_params();
  for (int epoch = static_cast<int>(step / steps_per_epoch); epoch < options_.epochs; ++epoch) {
    SUMMA_RETURN_IF_ERROR(SetOrder(EpochOrder(n, options_.seed, epoch)));
    SUMMA_RETURN_IF_ERROR(TakeLoss().status());  // a total left by an interrupted attempt
    const absl::Time start = absl::Now();
    absl::Time last_draw = start;
    int64_t examples = 0;
    int64_t global_examples = 0;
    // After step b (of the epoch's steps_per_epoch): its time, the status board, the progress bar.
    auto step_done = [&](int64_t b, absl::Time step_start) {
      const absl::Time now = absl::Now();
      if (options_.step_observer) options_.step_observer(now - step_start);
      const double rate = global_examples / std::max(1e-9, absl::ToDoubleSeconds(now - start));
      board_->Update([&](WorkerState& s) {
        s.epoch = epoch + 1;
        s.step = step;
        s.examples_per_second = rate;
      });
      if (options_.progress_bar && (now - last_draw > absl::Milliseconds(200) || b + 1 == steps_per_epoch)) {
        DrawProgress(epoch + 1, b + 1, steps_per_epoch, rate);
        last_draw = now;
      }
    };
    for (int64_t b = static_cast<int64_t>(step) - int64_t{epoch} * steps_per_epoch; b < steps_per_epoch; ++b) {
      // Overlapped, the last step's exchange still runs: its first reply names this step's group.
      if (overlapping_) SUMMA_RETURN_IF_ERROR(overlap_->AwaitGroup(&live_));
      // split_batch over the members still in the group.
      const auto me = std::find(live_.begin(), live_.end(), rank_);
      if (me == live_.end()) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", rank_, " is no longer in the group"));
      }
      const absl::Time step_start = absl::Now();
      if (sync_every_ > 0) {
        SUMMA_ASSIGN_OR_RETURN(const uint64_t next,
                               LocalSteps(step, epoch, b * sync_every_, std::min(batches_per_epoch, (b + 1) * sync_every_),
                                          &examples, &global_examples));
        step = next;
        ++steps_done_;
        step_done(b, step_start);
        continue;
      }
      const ShardRange shard = ShardOf(n, batch, b, static_cast<int>(me - live_.begin()),
                                       static_cast<int>(live_.size()));
      if (shard.size() > max_shard_) {
        return absl::InternalError(absl::StrCat("shard of ", shard.size(), " examples exceeds the ",
                                                max_shard_, " prepared for"));
      }
      if (options_.example_log != nullptr) {
        // Each attempt at the step: a step started again under a new group is written again.
        std::fprintf(options_.example_log, "step %llu epoch %d rank %d index %d of %d group %s begin %lld end %lld\n",
                     static_cast<unsigned long long>(step), epoch, rank_, static_cast<int>(me - live_.begin()),
                     static_cast<int>(live_.size()), absl::StrJoin(live_, ",").c_str(),
                     static_cast<long long>(shard.begin), static_cast<long long>(shard.end));
        std::fflush(options_.example_log);
      }
      Tracer* const tracer = options_.tracer;
      uint64_t next = step + 1;  // the step to push next
      if (overlapping_) {
        // This step's exchange runs on into the next step's forward, which waits per layer.
        TraceSpan compute(tracer, "compute", "worker");
        const Resident& r = resident_[0];
        overlap_->BeginCompute(step, shard.size());
        SUMMA_RETURN_IF_ERROR(models_[0]->ComputeGradientsPerLayer(
            Examples::Resident(r.image_table, r.label_table, r.rows + shard.begin), static_cast<int>(shard.size()),
            *overlap_));
        SUMMA_RETURN_IF_ERROR(overlap_->EndCompute());
      } else {
        std::optional<TraceSpan> compute(std::in_place, tracer, "compute", "worker");
        int devices = 1 << 30;
        for (const auto& [from, n] : options_.replay_groups) {
          if (from <= step) devices = n;
        }
        const std::vector<int>* summed = nullptr;
        for (const auto& [from, ds] : options_.replay_summed) {
          if (from <= step) summed = &ds;
        }
        SUMMA_ASSIGN_OR_RETURN(const int64_t pushed,
                               ComputeGradients(shard.begin, static_cast<int>(shard.size()), devices, summed));
        SUMMA_RETURN_IF_ERROR(models_[0]->GetGradients(gradients_->data()));
        compute.reset();
        {
          TraceSpan exchange(tracer, "exchange", "worker");
          SUMMA_ASSIGN_OR_RETURN(next, store_->PushPull(step, pushed, gradients_->data(), weights_->data(), &live_));
        }
        TraceSpan load(tracer, "load", "worker");
        SUMMA_RETURN_IF_ERROR(LoadWeights());
        ++steps_done_;  // overlapped, counted as its exchange ends (overlap_->steps_finished())
      }
      examples += shard.size();
      global_examples += std::min(batch, n - b * batch);
      if (next > step + 1) {
        // Backup workers: this push came after the step completed without it (dropped), and the
        // others went on; the weights are step `next`'s, and so is this rank's place in the data.
        if (options_.progress_bar) std::fprintf(out_, "\r\033[K");
        std::fprintf(out_, "rank %d: its push of step %llu came late (the step completed without it; "
                     "--backup_workers) and the job is at step %llu: skipping %llu step%s\n", rank_,
                     static_cast<unsigned long long>(step), static_cast<unsigned long long>(next),
                     static_cast<unsigned long long>(next - step - 1), next - step - 1 == 1 ? "" : "s");
        std::fflush(out_);
        // The loop's ++b lands on step `next`: past this epoch's end, the epochs it skipped run
        // no step, and each still sums its loss (this rank's share of the epoch, perhaps none).
        b += static_cast<int64_t>(next - step - 1);
      }
      step = next;
      step_done(b, step_start);
    }
    // The epoch's last exchange ends before the loss collective, the evaluation and the end.
    if (overlapping_) SUMMA_RETURN_IF_ERROR(overlap_->Settle(&live_));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    SUMMA_ASSIGN_OR_RETURN(const double loss_sum, TakeLoss());
    if (options_.progress_bar) std::fprintf(out_, "\r\033[K");
    SUMMA_ASSIGN_OR_RETURN(const std::vector<float> totals, EpochLoss(epoch, loss_sum, examples));
    EpochResult result;
    result.epoch = epoch + 1;
    result.loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
    result.seconds = seconds;
    result.examples_per_second = global_examples / std::max(1e-9, seconds);
    std::string accuracy;
    if (options_.evaluate) {
      board_->Update([](WorkerState& s) { s.state = "evaluating"; });
      SUMMA_ASSIGN_OR_RETURN(result.test_accuracy, TestAccuracy());
      accuracy = absl::StrFormat(", test acc %.3f", result.test_accuracy);
    }
    results_.push_back(result);
    board_->Update([&](WorkerState& s) {
      s.state = "training";
      s.last_loss = result.loss;
      s.last_test_accuracy = result.test_accuracy;
    });
    std::fprintf(out_, "epoch %d/%d: loss %.3f%s, %.2f sec/epoch, %.0f examples/s, %d worker%s on %s\n",
                 result.epoch, options_.epochs, result.loss, accuracy.c_str(), seconds,
                 result.examples_per_second, static_cast<int>(live_.size()),
                 live_.size() == 1 ? "" : "s", DevicesOf(live_).c_str());
    std::fflush(out_);
  }
  final_weights_.assign(weights_->data(), weights_->data() + params);
  return absl::OkStatus();
}

}  // namespace summa::worker
