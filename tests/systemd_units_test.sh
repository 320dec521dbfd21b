#!/usr/bin/env bash
# Verifies deploy/systemd's units with systemd-analyze verify, in a scratch root that holds the
# built binaries where the units expect them (/usr/local/bin) and the system's own units. Any
# warning fails the test, and a unit with a misspelled key must fail it too (so the check lives).
#   systemd_units_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
root=$(mktemp -d "${TMPDIR:-/tmp}/summa-systemd.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/etc/summa" "$root/usr/lib"
cp "$build/server/summa-server" "$build/worker/summa-worker" "$root/usr/local/bin/"
cp -r /usr/lib/systemd "$root/usr/lib/"
cp "$src/deploy/systemd/summa.env" "$root/etc/summa/"

verify() {  # prints what systemd-analyze said; fails on a status or any output
  local out
  out=$(systemd-analyze verify --root="$root" summa-server.service summa-worker@0.service summa-worker@1.service 2>&1)
  local rc=$?
  echo "$out"
  [[ $rc == 0 && -z "$out" ]]
}

cp "$src"/deploy/systemd/*.service "$root/etc/systemd/system/"
if ! verify; then
  echo "FAIL: deploy/systemd units do not verify cleanly"
  exit 1
fi
echo "deploy/systemd units verify cleanly"

sed 's/^Restart=on-failure/Restrat=on-failure/' "$src/deploy/systemd/summa-server.service" \
  >"$root/etc/systemd/system/summa-server.service"
if verify >/dev/null; then
  echo "FAIL: a misspelled key went unnoticed: the check is not working"
  exit 1
fi
echo "a misspelled key is caught"
