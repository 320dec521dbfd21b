#!/usr/bin/env bash
# Fails when docs/flags-summa-server.md or docs/flags-summa-worker.md no longer say what the built
# binaries' --help says (a flag added, removed or reworded without regenerating them), with the
# diff and the command that regenerates them.
#   flag_docs_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
(($# == 2)) || { echo "usage: tests/flag_docs_test.sh SOURCE_DIR BUILD_DIR" >&2; exit 2; }
exec bash "$1/scripts/flag-docs.sh" "$2" --check
