#!/usr/bin/env bash
# Verifies deploy/systemd's units with systemd-analyze verify, in a scratch root that holds the
# built binaries where the units expect them (/usr/local/bin), the credential files where
# LoadCredential= reads them (/etc/summa/credentials, from scripts/make-certs.sh) and the
# system's own units: first the units alone (plaintext, tokens), then with the TLS drop-ins. Any
# warning fails the test, and a unit with a misspelled key must fail it too (so the check lives).
# systemd-analyze cannot see what the command lines mean, so for each unit (with and without its
# drop-ins) this also checks that every credential a flag reads (${CREDENTIALS_DIRECTORY}/ID or
# %d/ID) is loaded by a LoadCredential=ID:, that every variable a drop-in sets is used by
# ExecStart, and that every --flag is one the binary knows.
#   systemd_units_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
root=$(mktemp -d "${TMPDIR:-/tmp}/summa-systemd.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/etc/summa" "$root/usr/lib"
cp "$build/server/summa-server" "$build/worker/summa-worker" "$root/usr/local/bin/"
cp -r /usr/lib/systemd "$root/usr/lib/"
cp "$src/deploy/systemd/summa.env" "$root/etc/summa/"
"$src/scripts/make-certs.sh" "$root/etc/summa/credentials" >/dev/null || { echo "FAIL: make-certs.sh"; exit 1; }
rm "$root/etc/summa/credentials/ca.key"

verify() {  # prints what systemd-analyze said; fails on a status or any output
  local out
  out=$(systemd-analyze verify --root="$root" summa-server.service summa-worker@0.service summa-worker@1.service 2>&1)
  local rc=$?
  echo "$out"
  [[ $rc == 0 && -z "$out" ]]
}

# check_meaning UNIT BINARY [DROPIN]: what the command line reads is loaded, set and known.
check_meaning() {
  local unit=$1 binary=$2 dropin=${3:-} files status=0
  files=("$src/deploy/systemd/$unit" ${dropin:+"$src/deploy/systemd/$dropin"})
  local loaded id var flag known
  loaded=$(sed -n 's/^LoadCredential=\([^:]*\):.*/\1/p' "${files[@]}")
  for id in $(grep -ho -e '${CREDENTIALS_DIRECTORY}/[A-Za-z0-9._-]*' -e '%d/[A-Za-z0-9._-]*' "${files[@]}" | sed 's|.*/||' | sort -u); do
    if ! grep -qx -- "$id" <<<"$loaded"; then
      echo "FAIL: $unit${dropin:+ + $dropin}: a flag reads credential $id, but no LoadCredential=$id: loads it"
      status=1
    fi
  done
  if [[ -n "$dropin" ]]; then
    for var in $(sed -n 's/^Environment="\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$src/deploy/systemd/$dropin"); do
      if ! grep -q "^ExecStart=.*\$$var\b" "$src/deploy/systemd/$unit"; then
        echo "FAIL: $dropin sets $var, which $unit's ExecStart does not use"
        status=1
      fi
    done
  fi
  known=$("$root/usr/local/bin/$binary" --helpfull 2>&1 | sed -n 's/^ *\(--[a-z_0-9]*\) .*/\1/p')
  for flag in $(grep -h -e '^ExecStart=' -e '^Environment=' "${files[@]}" | grep -o -- '--[a-z_0-9]*=' | tr -d = | sort -u); do
    if ! grep -qx -- "$flag" <<<"$known"; then
      echo "FAIL: $unit${dropin:+ + $dropin} passes $flag, which $binary does not know"
      status=1
    fi
  done
  return $status
}

cp "$src"/deploy/systemd/*.service "$root/etc/systemd/system/"
if ! verify; then
  echo "FAIL: deploy/systemd units do not verify cleanly"
  exit 1
fi
echo "deploy/systemd units verify cleanly"
cp -r "$src"/deploy/systemd/*.service.d "$root/etc/systemd/system/"
if ! verify; then
  echo "FAIL: deploy/systemd units with their TLS drop-ins do not verify cleanly"
  exit 1
fi
echo "deploy/systemd units with their TLS drop-ins verify cleanly"

meaning=0
check_meaning summa-server.service summa-server || meaning=1
check_meaning summa-server.service summa-server summa-server.service.d/tls.conf || meaning=1
check_meaning summa-worker@.service summa-worker || meaning=1
check_meaning summa-worker@.service summa-worker summa-worker@.service.d/tls.conf || meaning=1
if ((meaning)); then
  exit 1
fi
echo "every credential a flag reads is loaded, every drop-in variable used, every flag known"

sed 's/^Restart=on-failure/Restrat=on-failure/' "$src/deploy/systemd/summa-server.service" \
  >"$root/etc/systemd/system/summa-server.service"
if verify >/dev/null; then
  echo "FAIL: a misspelled key went unnoticed: the check is not working"
  exit 1
fi
echo "a misspelled key is caught"
