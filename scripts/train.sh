#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and trains the seed's LeNet on
# Fashion-MNIST with a local summa-server and 2 summa-worker processes (batch 256, lr 0.2,
# 10 epochs). Arguments go to scripts/launch.sh, e.g. `scripts/train.sh --workers 3 --epochs 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec scripts/launch.sh "$@"
