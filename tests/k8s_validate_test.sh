#!/usr/bin/env bash
# Renders every overlay under deploy/k8s/overlays with `kubectl kustomize` and validates each
# object offline (tests/k8s_validate/validate.mjs: API schemas from kubernetes-models, unknown
# fields from @kubernetes/client-node's models; versions locked in package-lock.json), and the
# Secrets scripts/k8s-secrets.sh prints. Each fixture under tests/k8s_validate/fixtures holds a
# deliberate error and must fail.
#   k8s_validate_test.sh SOURCE_DIR
set -uo pipefail
src=$1
v=$src/tests/k8s_validate
if [[ ! -d "$v/node_modules" ]]; then
  (cd "$v" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) || { echo "FAIL: npm ci"; exit 1; }
fi
status=0
for overlay in "$src"/deploy/k8s/overlays/*/; do
  name=$(basename "$overlay")
  if ! rendered=$(kubectl kustomize "$overlay"); then
    echo "FAIL: kubectl kustomize $name"
    status=1
    continue
  fi
  if node "$v/validate.mjs" <<<"$rendered"; then
    echo "ok: overlay $name"
  else
    echo "FAIL: overlay $name"
    status=1
  fi
done
# The Secrets scripts/k8s-secrets.sh prints for the overlays to mount.
secrets_dir=$(mktemp -d "${TMPDIR:-/tmp}/summa-k8s-secrets.XXXXXX")
trap 'rm -rf "$secrets_dir"' EXIT
if secrets=$("$src/scripts/k8s-secrets.sh" "$secrets_dir/material" summa 2>/dev/null) &&
   node "$v/validate.mjs" <<<"$secrets"; then
  echo "ok: scripts/k8s-secrets.sh"
else
  echo "FAIL: scripts/k8s-secrets.sh"
  status=1
fi
for fixture in "$v"/fixtures/*.yaml; do
  if node "$v/validate.mjs" <"$fixture" 2>/dev/null; then
    echo "FAIL: fixture $(basename "$fixture") holds a deliberate error but validated"
    status=1
  else
    echo "ok: fixture $(basename "$fixture") refused"
  fi
done
exit $status
