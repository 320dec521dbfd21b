#!/usr/bin/env bash
# The layering's include half (cmake/Layering.cmake checks the link half): no file of the RPC-free
# floors includes gRPC (a header-only gRPC type would pass the link check), and no file of the
# client includes BLAS or the worker's compute. Prints each offending line; exits 1 if any.
#   tests/layering_test.sh SOURCE_DIR
set -euo pipefail
cd "${1:?usage: tests/layering_test.sh SOURCE_DIR}"
status=0
check() {  # check <what> <extended regex of forbidden includes> <files...>
  local what=$1 pattern=$2
  shift 2
  local found
  found=$(grep -HnE "^#include [<\"]($pattern)" "$@" || true)
  if [[ -n "$found" ]]; then
    echo "layering: $what"
    echo "$found"
    status=1
  fi
}
rpc_free=(common/*.h common/*.cc server/core/*.h server/core/*.cc server/checkpoint/*.h server/checkpoint/*.cc)
check "these files are below gRPC (common/, server/core/, server/checkpoint/)" \
  'grpcpp/|grpc\+\+/|grpc/|[^"]*\.grpc\.pb\.h|common/rpc/|server/rpc/' "${rpc_free[@]}"
check "the client links no BLAS and no worker or server code (client/)" \
  'cblas\.h|worker/|server/' client/*.h client/*.cc
check "common/ is the lowest floor: it includes nothing of the server, the client or the worker" \
  'server/|client/|worker/' common/*.h common/*.cc common/rpc/*.h common/rpc/*.cc
check "checkpoint files are below the core (server/checkpoint/)" \
  'server/core/|server/rpc/' server/checkpoint/*.h server/checkpoint/*.cc
check "the server's core knows nothing of the client or the worker" \
  'client/|worker/' "${rpc_free[@]}" server/rpc/*.h server/rpc/*.cc
[[ $status == 0 ]] && echo "layering: the includes keep to the floors"
exit $status
