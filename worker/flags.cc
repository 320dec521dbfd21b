#include "worker/flags.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/optimizer.h"

// The structs whose defaults the flags take.
using summa::worker::DataPlaneName;
using summa::worker::SyntheticOptions;
using summa::worker::TrainerOptions;
using summa::worker::WorkerOptions;

ABSL_FLAG(std::string, server, WorkerOptions().server,
          "host:port of summa-server; for a sharded job (summa-server --shards=K), every shard's, "
          "comma-separated in shard order (shard 0 first: it assigns the rank)");
// -2 stands for "$JOB_COMPLETION_INDEX, else -1", which no options struct can hold.
ABSL_FLAG(int, rank, -2,
          "this worker's rank in [0, world_size); default: $JOB_COMPLETION_INDEX if set, else "
          "-1 (the server assigns the lowest free rank)");
ABSL_FLAG(int, world_size, TrainerOptions().world_size,
          "number of workers in the job: summa-server --workers=N's N, or for an elastic job "
          "(--workers=MIN:MAX) a number from MIN to MAX (MIN, say); each step's batch is split "
          "over the group the server names for it, whatever this says");
ABSL_FLAG(int64_t, batch_size, TrainerOptions().batch_size,
          "global minibatch size, split across all workers");
ABSL_FLAG(int, epochs, TrainerOptions().epochs, "passes over the training set");
ABSL_FLAG(std::string, model, TrainerOptions().model,
          "the network to train: lenet (the seed's LeNet) or mlp (d2l's 784-256-10 perceptron); "
          "every worker of a job must train the same one");
ABSL_FLAG(std::string, device, WorkerOptions().device,
          "cpu, cuda:N, or auto (a GPU when one works, else the CPU)");
ABSL_FLAG(std::string, devices, "",
          "several local devices for this one worker, e.g. cuda:0,cuda:1: the shard is split "
          "across them and their gradients summed on the first before the push (overrides "
          "--device)");
ABSL_FLAG(int, model_parallel, TrainerOptions().model_parallel,
          "1: data parallelism over --devices (the shard split across them). 2: model "
          "parallelism, the seed's second method: lenet's convolutions on the first of two "
          "--devices, its dense layers on the second, the activations and their gradients "
          "passed between them, the batch pipelined through them in --micro_batches; the "
          "worker still pushes and pulls as one rank");
ABSL_FLAG(int, micro_batches, TrainerOptions().micro_batches,
          "--model_parallel=2: micro-batches each batch is cut into (GPipe's schedule: more "
          "shrink the pipeline's bubble, each is a smaller pass)");
ABSL_FLAG(bool, overlap, TrainerOptions().overlap,
          "overlap each step's push-pull with the compute: each partition's gradient goes to the "
          "server as soon as backward has finished every layer in it (the last layers' first), "
          "and the next forward waits, layer by layer, only for the partitions holding that "
          "layer's weights. In sync mode the same weights, bit for bit, as --overlap=false, "
          "which exchanges the whole gradient after backward. Taken only with one device computing the whole "
          "model and a dense wire (no summa-server --compress; a --wire_dtype of 16 bits is encoded "
          "partition by partition). The "
          "model is cut where summa-server --partition_bytes says: LeNet fits in one partition "
          "of the default 4 MiB, and nothing then overlaps. Off by default: it pays only with a CPU "
          "core to spare (1 CPU worker); 2 CPU workers on 2 cores lose 3-9%, and on an H200 "
          "LeNet's epoch is 15-30% slower with it, 1.9x with 2 workers sharing the GPU (each "
          "layer's copies and waits, it seems; bench/results-train.md, bench/results-gpu.md). The join "
          "line says \"overlapped\" where it is on");
ABSL_FLAG(std::string, inner_optimizer, TrainerOptions().inner.name,
          "DiLoCo jobs (summa-server --mode=diloco): the optimizer of the local steps this worker "
          "takes between exchanges: sgd, adam or adamw (the paper's), PyTorch's semantics; its "
          "state lives across exchanges. Other jobs use the server's optimizer and ignore it");
ABSL_FLAG(double, inner_lr, TrainerOptions().inner.learning_rate, "DiLoCo: the inner learning rate");
ABSL_FLAG(double, inner_momentum, TrainerOptions().inner.momentum, "DiLoCo, inner sgd: momentum in [0, 1)");
ABSL_FLAG(double, inner_weight_decay, TrainerOptions().inner.weight_decay,
          "DiLoCo: the inner optimizer's weight decay (L2 for sgd and adam, decoupled for adamw)");
ABSL_FLAG(bool, inner_nesterov, TrainerOptions().inner.nesterov,
          "DiLoCo, inner sgd: Nesterov momentum (needs --inner_momentum > 0)");
ABSL_FLAG(double, inner_beta1, TrainerOptions().inner.beta1, "DiLoCo, inner adam or adamw: beta1, in [0, 1)");
ABSL_FLAG(double, inner_beta2, TrainerOptions().inner.beta2,
          "DiLoCo, inner adam or adamw: beta2, in [0, 1) (the DiLoCo paper's AdamW: 0.95)");
ABSL_FLAG(double, inner_eps, TrainerOptions().inner.eps, "DiLoCo, inner adam or adamw: added to the denominator");
ABSL_FLAG(std::string, data_dir, WorkerOptions().data_dir,
          "directory with the Fashion-MNIST (or MNIST) IDX files, gzipped or not");
ABSL_FLAG(uint64_t, seed, TrainerOptions().seed, "seed of the initial weights and of every epoch's shuffle");
ABSL_FLAG(int, threads, WorkerOptions().threads,
          "CPU threads computing this worker's shard: on the CPU the shard is split across T "
          "copies of the model, each on its own thread with one OpenBLAS thread, and their "
          "gradients summed before the push (with --devices naming cpu several times: the OpenBLAS "
          "threads of each)");
ABSL_FLAG(std::string, status_address, WorkerOptions().status_address,
          "host:port where this worker serves summa.v1.Worker/GetStatus (port 0: any free port)");
ABSL_FLAG(std::string, status_port_file, WorkerOptions().status_port_file,
          "if set, write the bound status port to this file");
ABSL_FLAG(std::string, metrics_address, WorkerOptions().metrics_address,
          "host:port for Prometheus metrics at /metrics (port 0: any free port); empty: none");
ABSL_FLAG(std::string, metrics_port_file, WorkerOptions().metrics_port_file,
          "if set, write the bound metrics port to this file");
ABSL_FLAG(int64_t, train_limit, WorkerOptions().train_limit,
          "train on only the first N training examples (0: all)");
ABSL_FLAG(int64_t, test_limit, WorkerOptions().test_limit,
          "evaluate on only the first N test examples (0: all)");
ABSL_FLAG(std::string, progress, "auto", "progress bar: auto (on a terminal), always, or never");
ABSL_FLAG(absl::Duration, call_deadline, WorkerOptions().call_deadline,
          "deadline of each call to the server (a push-pull waits for the slowest worker)");
ABSL_FLAG(absl::Duration, retry_deadline, TrainerOptions().retry_deadline,
          "how long to keep rejoining while the server is unreachable or restarted, counted from "
          "the last step that succeeded");
ABSL_FLAG(std::string, trace_file, WorkerOptions().trace_file,
          "if set, write a timeline of every step (compute, exchange, load, and each "
          "partition's push-pull; with --overlap, loads are inside compute, exchange is the "
          "wait for the last step's first reply and wait each layer's in the forward) to this file as Chrome trace JSON when the "
          "worker ends (open it in chrome://tracing or ui.perfetto.dev, with the server's)");
ABSL_FLAG(std::string, after_training, "exit",
          "what the worker does once its epochs are done and it has left the group: exit (status "
          "0), or wait until SIGTERM or SIGINT and then exit 0 (for a pod of a StatefulSet or "
          "Deployment, which would start an exited worker again: deploy/k8s/components/elastic); "
          "a signal while training ends the worker at once, as without this flag");
ABSL_FLAG(std::string, example_log, WorkerOptions().example_log,
          "if set, append a line to this file for each attempt at each step: the step, its epoch, "
          "this rank's index in the step's group, the group, and the range [begin, end) of the "
          "epoch's shuffled order its shard covers (an audit that every example is seen once "
          "across joins and losses: a step started again is written again)");
ABSL_FLAG(std::string, tls_ca, WorkerOptions().tls.ca,
          "PEM CA that signed the server's certificate: talk TLS to the server (needed for TLS)");
ABSL_FLAG(std::string, tls_cert, WorkerOptions().tls.cert,
          "PEM certificate of this worker: sent to a server that asks for client certificates "
          "(mTLS), and served on the status endpoint; with --tls_key");
ABSL_FLAG(std::string, tls_key, WorkerOptions().tls.key, "PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, WorkerOptions().token_file,
          "file holding the bearer token the server asks members for (summa-server --token_file: "
          "a token scoped to a rank acts only as that rank), alone; read again when it changes "
          "(every 5 s), so a rotated secret needs no restart");
ABSL_FLAG(int, channels, WorkerOptions().channels,
          "TCP connections to summa-server; the model's partitions are spread over them (partition i "
          "on connection i mod channels). More than 1 helps only where one connection is the limit");
ABSL_FLAG(std::string, data_plane, DataPlaneName(WorkerOptions().data_plane),
          "the data path's transport: auto (for each shard on this host that serves one, its "
          "shared-memory plane, summa-server --shm_socket; else the socket data plane, summa-server "
          "--data_address, where every shard serves one and it can be reached; gRPC otherwise), "
          "grpc (always gRPC), socket (the socket data plane or an error), shm (every shard's "
          "shared-memory plane, so every shard on this host, or an error)");
ABSL_FLAG(absl::Duration, join_deadline, WorkerOptions().join_deadline,
          "how long to keep retrying to join while the server is not up or has no model yet");
ABSL_FLAG(std::string, synthetic, "",
          "SIZE (e.g. 64MiB, 1GiB; K, M, G and KiB, MiB, GiB all count in 1024s): instead of "
          "training, join with a model of SIZE bytes of float32 parameters and run --steps "
          "synchronous steps that push a fixed gradient (every element of rank r's is r + 1) and "
          "pull the new weights, computing nothing and loading no data; at the end print one "
          "line 'synthetic_result ...' with the step times, the bytes pushed and pulled per step "
          "and the final first weight (bench/scale drives this). Takes --server, --rank, "
          "--world_size, --steps, --call_deadline, --join_deadline and --channels; the training "
          "flags do not apply");
ABSL_FLAG(int64_t, steps, SyntheticOptions().steps, "--synthetic: synchronous steps to run (at least 1)");

#if SUMMA_FAULT_INJECTION
// Test builds only (-DSUMMA_FAULT_INJECTION=ON): a production summa-worker refuses these as
// unknown flags.
using summa::worker::FaultPlan;
ABSL_FLAG(int64_t, fault_exit_after_push, FaultPlan().exit_after_push,
          "fault injection for tests: from this step on, at the first push that leaves its step "
          "waiting for other workers, exit right after the push (status 137), as a worker killed "
          "between its push and the reply would; -1: never");
ABSL_FLAG(int64_t, fault_repeat_pushpull_at, FaultPlan().repeat_push_pull_at,
          "fault injection for tests: at this step, drop the reply to the push-pull and send it "
          "again, as a client whose reply was lost retries; -1: never");
ABSL_FLAG(std::string, fault_pause, "",
          "fault injection for tests: STEP:FILE,... before the push of each STEP, say so and wait "
          "until FILE exists (the lease kept meanwhile); empty: never");
ABSL_FLAG(std::string, fault_replay_groups, "",
          "for tests: STEP:N,STEP:N,... from each STEP on, split each step's shard over the first N "
          "devices only (--devices=cpu,cpu,cpu), so that one worker replays an elastic job whose "
          "group had N ranks from STEP (its group log); empty: every device");
ABSL_FLAG(std::string, fault_replay_summed, "",
          "for tests, with --fault_replay_groups: STEP:D+D+...,... from each STEP on, compute and sum "
          "only these devices' shares of each step's split (device 0 among them) and push their "
          "examples, so that one worker replays a job with backup workers whose steps summed only "
          "those ranks' pushes; empty: every device's share");
ABSL_FLAG(int64_t, fault_exit_before_epoch_end, FaultPlan().exit_before_round,
          "fault injection for tests: exit (status 137) after the last push of this epoch "
          "(0-based), before the epoch-end loss collective; -1: never");
ABSL_FLAG(absl::Duration, fault_delay_push, FaultPlan().delay_push,
          "fault injection for tests: wait this long before every push, so that this worker's "
          "pushes reach the server after the others' (a test forcing the arrival order); 0: never");
ABSL_FLAG(bool, fault_hold_push_until_fenced, FaultPlan().hold_push_until_fenced,
          "fault injection for tests: hold the first push (at most 2 minutes) until a later process "
          "started as this rank has fenced this one, then push (and be refused): two processes of "
          "one rank in a set order");
#endif  // SUMMA_FAULT_INJECTION

namespace summa::worker {
namespace {

// Whether `flag` holds something other than its default (Abseil 20220623 keeps "given on the
// command line" to itself; a flag given its default value changes nothing anyway).
bool Changed(const char* flag) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

// --rank, or its default: $JOB_COMPLETION_INDEX (an indexed Job's pod) when set, else -1.
int Rank() {
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank != -2) return rank;
  const char* index = std::getenv("JOB_COMPLETION_INDEX");
  return index != nullptr ? std::atoi(index) : -1;
}

}  // namespace

bool SyntheticRequested() { return Changed("synthetic"); }

absl::StatusOr<SyntheticOptions> SyntheticOptionsFromFlags() {
  // Training flags given with --synthetic are a mistake, not something to ignore quietly.
  for (const char* training : {"batch_size", "epochs", "model", "device", "devices", "model_parallel",
                               "micro_batches", "data_dir", "seed",
                               "threads", "train_limit", "test_limit", "progress", "status_address",
                               "status_port_file", "metrics_address", "metrics_port_file",
                               "retry_deadline", "trace_file", "example_log", "after_training",
                               // Test builds only; Changed is false for a flag not defined.
                               "fault_exit_after_push", "fault_repeat_pushpull_at",
                               "fault_exit_before_epoch_end", "fault_delay_push", "fault_replay_groups", "fault_replay_summed",
                               "fault_pause", "fault_hold_push_until_fenced"}) {
    if (Changed(training)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", training, " does not apply to --synthetic (it trains no model; see --help)"));
    }
  }
  SyntheticOptions o;
  absl::StatusOr<int64_t> bytes = ParseByteSize(absl::GetFlag(FLAGS_synthetic));
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--synthetic: ", bytes.status().message()));
  o.model_bytes = *bytes;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.rank = Rank();
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.server = absl::GetFlag(FLAGS_server);
  o.call_deadline = absl::GetFlag(FLAGS_call_deadline);
  o.join_deadline = absl::GetFlag(FLAGS_join_deadline);
  o.channels = absl::GetFlag(FLAGS_channels);
  absl::StatusOr<DataPlane> plane = ParseDataPlane(absl::GetFlag(FLAGS_data_plane));
  if (!plane.ok()) return plane.status();
  o.data_plane = *plane;
  if (absl::Status valid = ValidateSyntheticOptions(o); !valid.ok()) return valid;
  return o;
}

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags() {
  if (Changed("steps")) return absl::InvalidArgumentError("--steps applies only with --synthetic=SIZE");
  WorkerOptions o;
  o.trainer.rank = Rank();
  o.trainer.world_size = absl::GetFlag(FLAGS_world_size);
  o.trainer.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.trainer.epochs = absl::GetFlag(FLAGS_epochs);
  o.trainer.model = absl::GetFlag(FLAGS_model);
  o.trainer.model_parallel = absl::GetFlag(FLAGS_model_parallel);
  o.trainer.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  o.trainer.inner.name = absl::GetFlag(FLAGS_inner_optimizer);
  o.trainer.inner.learning_rate = absl::GetFlag(FLAGS_inner_lr);
  o.trainer.inner.momentum = absl::GetFlag(FLAGS_inner_momentum);
  o.trainer.inner.weight_decay = absl::GetFlag(FLAGS_inner_weight_decay);
  o.trainer.inner.nesterov = absl::GetFlag(FLAGS_inner_nesterov);
  o.trainer.inner.beta1 = absl::GetFlag(FLAGS_inner_beta1);
  o.trainer.inner.beta2 = absl::GetFlag(FLAGS_inner_beta2);
  o.trainer.inner.eps = absl::GetFlag(FLAGS_inner_eps);
  if (absl::Status inner = Optimizer::Create(o.trainer.inner).status(); !inner.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--inner_optimizer: ", inner.message()));
  }
  if (o.trainer.model_parallel != 1 && o.trainer.model_parallel != 2) {
    return absl::InvalidArgumentError(absl::StrCat("--model_parallel must be 1 or 2, got ",
                                                   o.trainer.model_parallel));
  }
  if (o.trainer.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--micro_batches must be at least 1, got ",
                                                   o.trainer.micro_batches));
  }
  if (o.trainer.model_parallel == 2 && absl::GetFlag(FLAGS_devices).empty()) {
    return absl::InvalidArgumentError("--model_parallel=2 splits the model across two devices: name them with "
                                      "--devices (cpu,cpu here; cuda:0,cuda:1 with two GPUs)");
  }
  if (o.trainer.model_parallel == 1 && Changed("micro_batches")) {
    return absl::InvalidArgumentError("--micro_batches applies only with --model_parallel=2");
  }
  o.trainer.seed = absl::GetFlag(FLAGS_seed);
  o.trainer.overlap = absl::GetFlag(FLAGS_overlap);
  const std::string progress = absl::GetFlag(FLAGS_progress);
  if (progress != "auto" && progress != "always" && progress != "never") {
    return absl::InvalidArgumentError("--progress must be auto, always or never");
  }
  o.trainer.progress_bar = progress == "always" || (progress == "auto" && ::isatty(STDOUT_FILENO));
  o.server = absl::GetFlag(FLAGS_server);
  o.device = absl::GetFlag(FLAGS_devices).empty() ? absl::GetFlag(FLAGS_device) : absl::GetFlag(FLAGS_devices);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.train_limit = absl::GetFlag(FLAGS_train_limit);
  o.test_limit = absl::GetFlag(FLAGS_test_limit);
  o.status_address = absl::GetFlag(FLAGS_status_address);
  o.status_port_file = absl::GetFlag(FLAGS_status_port_file);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  o.call_deadline = absl::GetFlag(FLAGS_call_deadline);
  o.join_deadline = absl::GetFlag(FLAGS_join_deadline);
  o.channels = absl::GetFlag(FLAGS_channels);
  absl::StatusOr<DataPlane> plane = ParseDataPlane(absl::GetFlag(FLAGS_data_plane));
  if (!plane.ok()) return plane.status();
  o.data_plane = *plane;
  o.trace_file = absl::GetFlag(FLAGS_trace_file);
  o.example_log = absl::GetFlag(FLAGS_example_log);
  const std::string after = absl::GetFlag(FLAGS_after_training);
  if (after != "exit" && after != "wait") {
    return absl::InvalidArgumentError(absl::StrCat("--after_training=", after, ": give exit or wait"));
  }
  o.after_training_wait = after == "wait";
  o.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.trainer.retry_deadline = absl::GetFlag(FLAGS_retry_deadline);
#if SUMMA_FAULT_INJECTION
  o.faults.exit_after_push = absl::GetFlag(FLAGS_fault_exit_after_push);
  o.faults.repeat_push_pull_at = absl::GetFlag(FLAGS_fault_repeat_pushpull_at);
  o.faults.exit_before_round = absl::GetFlag(FLAGS_fault_exit_before_epoch_end);
  o.faults.delay_push = absl::GetFlag(FLAGS_fault_delay_push);
  o.faults.hold_push_until_fenced = absl::GetFlag(FLAGS_fault_hold_push_until_fenced);
  if (o.faults.delay_push < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--fault_delay_push must not be negative");
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_fault_pause), ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    int64_t step = 0;
    if (!absl::SimpleAtoi(parts.first, &step) || step < 0 || parts.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--fault_pause: '", item, "' is not STEP:FILE"));
    }
    o.faults.pauses.push_back({step, std::string(parts.second)});
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_fault_replay_groups), ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    uint64_t from = 0;
    int n = 0;
    if (!absl::SimpleAtoi(parts.first, &from) || !absl::SimpleAtoi(parts.second, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--fault_replay_groups: '", item, "' is not STEP:N with N >= 1"));
    }
    o.trainer.replay_groups.push_back({from, n});
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_fault_replay_summed), ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    uint64_t from = 0;
    std::vector<int> devices;
    bool parsed = absl::SimpleAtoi(parts.first, &from);
    for (absl::string_view d : absl::StrSplit(parts.second, '+')) {
      int device = -1;
      parsed = parsed && absl::SimpleAtoi(d, &device) && device >= 0 && (devices.empty() || device > devices.back());
      devices.push_back(device);
    }
    if (!parsed || devices.front() != 0 || o.trainer.replay_groups.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--fault_replay_summed: '", item,
                                                     "' is not STEP:0+D+... (ascending devices, 0 first), or "
                                                     "--fault_replay_groups is not given"));
    }
    o.trainer.replay_summed.push_back({from, std::move(devices)});
  }
#endif
  return o;
}

}  // namespace summa::worker
