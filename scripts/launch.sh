#!/usr/bin/env bash
# Runs a Summa job on this machine: one summa-server (or K shards of one) and N summa-worker
# processes, or with --python SCRIPT, N processes of a Python training script that uses the summa
# package.
# Rank 0 prints to this terminal (with a progress bar on a tty); the server's and the other
# workers' output goes to log files in the run directory. Ctrl-C or any failure stops every
# process; the exit status is non-zero if any process failed.
#
#   scripts/launch.sh [--workers N] [--shards K] [--epochs E] [--batch_size B] [--lr LR]
#                     [--bin DIR] [--run_dir DIR] [--trace_dir DIR] [--server_args "FLAGS"]
#                     [--python SCRIPT] [-- extra summa-worker (or SCRIPT) flags]
# --shards: K summa-server shards (--shards=K --shard=I, each with --server_args; shard 0 writes
# server.{port,log,pid}, shard I shardI.*); workers get every shard's address. The model needs
# at least K partitions: give a --partition_bytes in --server_args for a small model (LeNet's
# 129068 parameters are 8 partitions of 64 KiB: --server_args "--partition_bytes=65536").
# --python: each process runs $SUMMA_PYTHON (default /usr/bin/python3, Debian's, with torch)
# SCRIPT --server=127.0.0.1:PORT --world_size=N with RANK and WORLD_SIZE set and the build tree's summa package on PYTHONPATH; --epochs and
# --batch_size are passed on only when given.
# The server serves the socket data plane and, in the run directory, the shared-memory plane
# (--shm_socket), which the workers, all on this host, take.
# --trace_dir: every process writes its timeline there (server.json, worker<r>.json; Chrome
# trace JSON); bench/trace_summary.py sums them up per stage.
# e.g. --server_args "--mode=ssp --staleness=2 --checkpoint_dir=/tmp/ckpt"
# --server_args "--mode=diloco ..." (or diloco-async): the server's optimizer is the outer one,
# so --lr goes to the workers as --inner_lr (a later -- --inner_lr=X wins), not to the server.
set -uo pipefail

workers=2 shards=1 epochs=10 batch=256 lr=0.2
bin="$(cd "$(dirname "$0")/.." && pwd)/build"
run_dir=""
server_args=""
extra=()
python_script=""
given=()  # --epochs and --batch_size as given, for a --python script
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; given+=(--epochs="$2"); shift 2 ;;
    --batch_size) batch=$2; given+=(--batch_size="$2"); shift 2 ;;
    --python) python_script=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --run_dir) run_dir=$2; shift 2 ;;
    --server_args) server_args=$2; shift 2 ;;
    --trace_dir) trace_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "launch: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "launch: --workers must be a positive integer" >&2; exit 2; }
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "launch: --shards must be a positive integer" >&2; exit 2; }
if ((shards > 1)) && [[ -n "$python_script" ]]; then
  echo "launch: --shards needs summa-worker (the Python client talks to one server)" >&2; exit 2
fi
server_bin="$bin/server/summa-server"
worker_bin="$bin/worker/summa-worker"
needed=("$server_bin" "$worker_bin")
if [[ -n "$python_script" ]]; then
  needed=("$server_bin")
  [[ -f "$python_script" ]] || { echo "launch: --python $python_script not found" >&2; exit 2; }
  [[ -f "$bin/python/summa/v1/summa_pb2.py" ]] || { echo "launch: $bin/python/summa not built (cmake --build build --target summa_python)" >&2; exit 2; }
fi
for b in "${needed[@]}"; do
  [[ -x "$b" ]] || { echo "launch: $b not found; build first (scripts/build.sh)" >&2; exit 2; }
done
# DiLoCo refuses the server's --lr: it is the workers' inner rate there.
server_lr=(--lr="$lr")
inner_lr=()
if [[ " $server_args " =~ [[:space:]]--mode=diloco(-async)?[[:space:]] ]]; then
  server_lr=()
  inner_lr=(--inner_lr="$lr")
fi
run_dir=${run_dir:-$(mktemp -d "${TMPDIR:-/tmp}/summa-run.XXXXXX")}
mkdir -p "$run_dir"

pids=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
}
trap 'stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

# Shard 0 (the only server without --shards) writes server.*, shard i shard<i>.*.
addresses=()
for ((i = 0; i < shards; i++)); do
  name=server
  ((i > 0)) && name="shard$i"
  shard_flags=()
  ((shards > 1)) && shard_flags=(--shards="$shards" --shard="$i")
  # The other shards follow shard 0's membership view.
  ((i > 0)) && shard_flags+=(--coordinator="${addresses[0]}")
  server_trace=()
  if [[ -n "${trace_dir:-}" ]]; then
    mkdir -p "$trace_dir" || { echo "launch: cannot create --trace_dir $trace_dir" >&2; exit 2; }
    server_trace=(--trace_file="$trace_dir/$name.json")
  fi
  # The data path on the socket data plane, which workers find by themselves (a TLS job keeps
  # it on gRPC).
  data_plane=(--data_address=127.0.0.1:0)
  [[ "$server_args" == *--tls_cert* ]] && data_plane=()
  # Every worker is on this host: the shared-memory plane, which they prefer (--data_plane=auto),
  # where the run directory's path fits a Unix socket's.
  shm_socket="$run_dir/$name.shm.sock"
  ((${#shm_socket} < 100)) && [[ "$server_args" != *--shm_socket* ]] && data_plane+=(--shm_socket="$shm_socket")
  "$server_bin" --address=127.0.0.1:0 --port_file="$run_dir/$name.port" --workers="$workers" \
    "${server_lr[@]}" "${data_plane[@]}" "${shard_flags[@]}" "${server_trace[@]}" $server_args >"$run_dir/$name.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  echo "$server_pid" >"$run_dir/$name.pid"
  for _ in $(seq 300); do
    [[ -s "$run_dir/$name.port" ]] && break
    kill -0 "$server_pid" 2>/dev/null || { echo "launch: summa-server ($name) failed:" >&2; cat "$run_dir/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -s "$run_dir/$name.port" ]] || { echo "launch: summa-server ($name) did not listen within 30 s" >&2; exit 1; }
  addresses+=("127.0.0.1:$(cat "$run_dir/$name.port")")
done
port=$(cat "$run_dir/server.port")
servers=$(IFS=,; echo "${addresses[*]}")
if [[ -n "$python_script" ]]; then
  # The script keeps its own batch and length unless --batch_size or --epochs were given.
  echo "launch: summa-server on $servers (lr $lr), $workers processes of $python_script${given[*]:+ ${given[*]}}; logs in $run_dir"
else
  echo "launch: summa-server on $servers, $workers workers, batch $batch, lr $lr, $epochs epochs; logs in $run_dir"
fi

declare -A rank_of
for ((r = 0; r < workers; r++)); do
  if [[ -n "$python_script" ]]; then
    cmd=(env RANK="$r" WORLD_SIZE="$workers" PYTHONPATH="$bin/python${PYTHONPATH:+:$PYTHONPATH}"
         OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
         "${SUMMA_PYTHON:-/usr/bin/python3}" "$python_script" --server="127.0.0.1:$port" --world_size="$workers"
         "${given[@]}" "${extra[@]}")
  else
    cmd=("$worker_bin")
  fi
  args=(--server="$servers" --rank="$r" --world_size="$workers" --batch_size="$batch"
        --epochs="$epochs" --status_port_file="$run_dir/worker$r.status_port" "${inner_lr[@]}" "${extra[@]}")
  [[ -n "${trace_dir:-}" ]] && args+=(--trace_file="$trace_dir/worker$r.json")
  # A Python script takes its own flags (after --), not summa-worker's.
  [[ -n "$python_script" ]] && args=()
  if ((r == 0)) && [[ -n "$python_script" ]]; then
    "${cmd[@]}" > >(tee "$run_dir/worker0.log") 2>&1 &
  elif ((r == 0)); then
    "${cmd[@]}" "${args[@]}" 2> >(tee "$run_dir/worker0.log" >&2) &
  else
    "${cmd[@]}" "${args[@]}" >"$run_dir/worker$r.log" 2>&1 &
  fi
  pids+=($!)
  rank_of[$!]=$r
  echo "$!" >"$run_dir/worker$r.pid"
done

status=0
running=("${pids[@]:shards}")
while ((${#running[@]})); do
  wait -n -p done_pid "${running[@]}"
  rc=$?
  still=()
  for pid in "${running[@]}"; do [[ "$pid" != "$done_pid" ]] && still+=("$pid"); done
  running=("${still[@]}")
  if ((rc != 0)); then
    r=${rank_of[$done_pid]:-?}
    echo "launch: worker $r (pid $done_pid) failed with status $rc; stopping the job" >&2
    [[ "$r" != 0 ]] && tail -n 5 "$run_dir/worker$r.log" >&2
    status=1
    break
  fi
done
stop_all
if ((status == 0)); then echo "launch: all $workers workers finished"; fi
exit $status
