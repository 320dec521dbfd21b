#!/usr/bin/env bash
# Prints the Secrets that deploy/k8s mounts, made from throwaway material (scripts/make-certs.sh)
# that it writes to DIR, for kubectl apply:
#
#   scripts/k8s-secrets.sh DIR [NAMESPACE] [--rank_tokens=N] | kubectl apply -f -
#
# summa-tokens      worker-token, admin-token (the base, so every overlay)
# summa-server-tls  type kubernetes.io/tls: tls.crt, tls.key, ca.crt; the certificate names
#                   summa-server-0.summa-server, the address the workers dial (and, given a
#                   NAMESPACE, summa-server-0.summa-server.NAMESPACE.svc[.cluster.local])
# summa-worker-tls  type kubernetes.io/tls: the workers' client certificate, its key, ca.crt
# --rank_tokens=N   a token per rank, for components/rank-tokens (overlay cpu-demo-rank-tokens):
#                   Secret summa-rank-tokens, keys rank-0 ... rank-(N-1), each that rank's token
#                   alone (DIR/rank-R.token); summa-tokens' worker-token is then the server's list
#                   (DIR/worker-tokens): a comment, the bare worker.token (any rank: shard
#                   coordination), and TOKEN rank=R for each rank. N = the job's worker count.
# The TLS Secrets are for components/tls (overlay cpu-demo-tls). Keys are unencrypted and valid
# for 30 days: for demos and tests. In production cert-manager (or your CA) writes the two TLS
# Secrets with the same keys, and the tokens come from your secret store.
set -euo pipefail
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "k8s-secrets: $*" >&2; exit 2; }
positional=() rank_tokens=
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --rank_tokens=*)
      rank_tokens=${arg#--rank_tokens=}
      [[ "$rank_tokens" =~ ^[1-9][0-9]*$ ]] ||
        fail "--rank_tokens=$rank_tokens: N must be a whole number, 1 or more (the job's worker count)"
      # A Secret holds at most 1 MiB: 4096 ranks' list is about 0.4 MiB once base64-encoded.
      ((${#rank_tokens} <= 4 && rank_tokens <= 4096)) ||
        fail "--rank_tokens=$rank_tokens: at most 4096 ranks (a Secret holds at most 1 MiB)" ;;
    --rank_tokens) fail "--rank_tokens needs its count: --rank_tokens=N" ;;
    -*) fail "unknown option $arg (see --help)" ;;
    *) positional+=("$arg") ;;
  esac
done
if ((${#positional[@]} < 1 || ${#positional[@]} > 2)); then
  usage >&2
  exit 2
fi
command -v kubectl >/dev/null || { echo "k8s-secrets: kubectl is not installed" >&2; exit 1; }
dir=${positional[0]} namespace=${positional[1]:-}
names=(summa-server-0.summa-server)
ns=()
if [[ -n "$namespace" ]]; then
  names+=("summa-server-0.summa-server.$namespace.svc" "summa-server-0.summa-server.$namespace.svc.cluster.local")
  ns=(--namespace "$namespace")
fi
"$(dirname "$0")/make-certs.sh" "$dir" "${names[@]}" >&2
secret() { kubectl create secret generic "$@" "${ns[@]}" --dry-run=client -o yaml; }
worker_tokens=$dir/worker.token
if [[ -n "$rank_tokens" ]]; then
  # DIR holds this run's ranks only: no rank-R.token left from a run with a larger N.
  rm -f "$dir"/rank-*.token
  rank_files=()
  worker_tokens=$dir/worker-tokens
  {
    echo "# summa-server's --token_file: the bare token first, for any rank (shard coordination,"
    echo "# --coordinator; no worker holds it), then TOKEN rank=R, rank R's only (summa-rank-tokens' rank-R)"
    cat "$dir/worker.token"
    for ((r = 0; r < rank_tokens; r++)); do
      (umask 077; openssl rand -hex 32 >"$dir/rank-$r.token")
      echo "$(cat "$dir/rank-$r.token") rank=$r"
      rank_files+=(--from-file=rank-$r="$dir/rank-$r.token")
    done
  } >"$worker_tokens.new"
  chmod 600 "$worker_tokens.new"
  mv "$worker_tokens.new" "$worker_tokens"
  echo "k8s-secrets: wrote $rank_tokens rank tokens (rank-R.token) and worker-tokens (the server's list) in $dir" >&2
fi
secret summa-tokens --from-file=worker-token="$worker_tokens" --from-file=admin-token="$dir/admin.token"
echo ---
secret summa-server-tls --type=kubernetes.io/tls --from-file=tls.crt="$dir/server.pem" \
  --from-file=tls.key="$dir/server.key" --from-file=ca.crt="$dir/ca.pem"
echo ---
secret summa-worker-tls --type=kubernetes.io/tls --from-file=tls.crt="$dir/client.pem" \
  --from-file=tls.key="$dir/client.key" --from-file=ca.crt="$dir/ca.pem"
if [[ -n "$rank_tokens" ]]; then
  echo ---
  secret summa-rank-tokens "${rank_files[@]}"
fi
