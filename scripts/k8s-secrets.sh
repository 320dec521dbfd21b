#!/usr/bin/env bash
# Prints the Secrets that deploy/k8s mounts, made from throwaway material (scripts/make-certs.sh)
# that it writes to DIR, for kubectl apply:
#
#   scripts/k8s-secrets.sh DIR [NAMESPACE] | kubectl apply -f -
#
# summa-tokens      worker-token, admin-token (the base, so every overlay)
# summa-server-tls  type kubernetes.io/tls: tls.crt, tls.key, ca.crt; the certificate names
#                   summa-server-0.summa-server, the address the workers dial (and, given a
#                   NAMESPACE, summa-server-0.summa-server.NAMESPACE.svc[.cluster.local])
# summa-worker-tls  type kubernetes.io/tls: the workers' client certificate, its key, ca.crt
# The TLS Secrets are for components/tls (overlay cpu-demo-tls). Keys are unencrypted and valid
# for 30 days: for demos and tests. In production cert-manager (or your CA) writes the two TLS
# Secrets with the same keys, and the tokens come from your secret store.
set -euo pipefail
if (($# < 1)) || (($# > 2)) || [[ "$1" == -h || "$1" == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit $(( $# < 1 || $# > 2 ? 2 : 0 ))
fi
command -v kubectl >/dev/null || { echo "k8s-secrets: kubectl is not installed" >&2; exit 1; }
dir=$1 namespace=${2:-}
names=(summa-server-0.summa-server)
ns=()
if [[ -n "$namespace" ]]; then
  names+=("summa-server-0.summa-server.$namespace.svc" "summa-server-0.summa-server.$namespace.svc.cluster.local")
  ns=(--namespace "$namespace")
fi
"$(dirname "$0")/make-certs.sh" "$dir" "${names[@]}" >&2
secret() { kubectl create secret generic "$@" "${ns[@]}" --dry-run=client -o yaml; }
secret summa-tokens --from-file=worker-token="$dir/worker.token" --from-file=admin-token="$dir/admin.token"
echo ---
secret summa-server-tls --type=kubernetes.io/tls --from-file=tls.crt="$dir/server.pem" \
  --from-file=tls.key="$dir/server.key" --from-file=ca.crt="$dir/ca.pem"
echo ---
secret summa-worker-tls --type=kubernetes.io/tls --from-file=tls.crt="$dir/client.pem" \
  --from-file=tls.key="$dir/client.key" --from-file=ca.crt="$dir/ca.pem"
