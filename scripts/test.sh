#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)"
