#!/usr/bin/env bash
# The test suite's summa-worker has the test-only --fault_* flags (tests/fault_process_test.py,
# shard_fault_process_test.py and train_process_test.py drive the real binary through them),
# exactly when its build was configured with -DSUMMA_FAULT_INJECTION=ON:
#   tests/fault_injection_build_test.sh SUMMA_WORKER ON|OFF
# ON: --helpfull lists every fault flag. OFF (a production build, as the image's): it lists none
# and --fault_exit_after_push is refused as an unknown flag; the test then fails all the same,
# since the suite needs them. The image's own summa-worker is checked by tests/container_test.py.
set -euo pipefail
worker=${1:?usage: fault_injection_build_test.sh SUMMA_WORKER ON|OFF}
configured=${2:?usage: fault_injection_build_test.sh SUMMA_WORKER ON|OFF}
help=$("$worker" --helpfull 2>&1 || true)  # --helpfull exits 1
if [[ "$configured" == ON ]]; then
  for flag in fault_exit_after_push fault_repeat_pushpull_at fault_exit_before_epoch_end fault_delay_push \
      fault_hold_push_until_fenced; do
    if ! grep -q -- "--$flag " <<<"$help"; then
      echo "FAIL: built with SUMMA_FAULT_INJECTION=ON, but $worker --helpfull lists no --$flag"
      exit 1
    fi
  done
  echo "ok: $worker has the --fault_* flags"
  exit 0
fi
if grep -q -- '--fault_' <<<"$help"; then
  echo "FAIL: built without fault injection, but $worker --helpfull lists" \
    "$(grep -o -- '--fault_[a-z_]*' <<<"$help" | tr '\n' ' ')"
  exit 1
fi
if refused=$("$worker" --fault_exit_after_push=0 2>&1); then
  echo "FAIL: built without fault injection, but $worker took --fault_exit_after_push"
  exit 1
fi
if ! grep -q "Unknown command line flag 'fault_exit_after_push'" <<<"$refused"; then
  echo "FAIL: $worker refused --fault_exit_after_push, but not as an unknown flag: $refused"
  exit 1
fi
echo "FAIL: this build has no fault injection (its summa-worker refuses --fault_exit_after_push as" \
  "an unknown flag, as a production build must), but the test suite needs it: configure with" \
  "-DSUMMA_FAULT_INJECTION=ON, as scripts/build.sh does"
exit 1
