#!/usr/bin/env bash
# Runs the container engine the way this project's machines need it; scripts/image.sh and the
# container test (tests/container_test.py) call every engine command through here.
#   scripts/container.sh SUBCOMMAND [ARGS...]    e.g. build, run, create, start, logs, rm, inspect
#   scripts/container.sh --which                 prints the engine, or why there is none (exit 1)
# The engine is podman when it is installed (scripts/setup.sh --image installs it), else docker
# when a docker daemon answers; SUMMA_CONTAINER_ENGINE=podman|docker chooses.
# On these VMs podman needs runc and cgroupfs, and `build` and `run` need limits it does not
# try to raise (raising one is refused) and the host's network.
set -euo pipefail

which_engine() {
  local wanted=${SUMMA_CONTAINER_ENGINE:-}
  if [[ -z "$wanted" || "$wanted" == podman ]] && command -v podman >/dev/null; then
    echo podman
  elif [[ -z "$wanted" || "$wanted" == docker ]] && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    echo docker
  else
    echo "no container engine: ${wanted:-podman} is not installed${wanted:+ or does not answer}" \
      "(scripts/setup.sh --image installs podman)" >&2
    return 1
  fi
}

if [[ "${1:-}" == --which ]]; then
  which_engine
  exit
fi
if (($# == 0)); then
  echo "usage: scripts/container.sh SUBCOMMAND [ARGS...] | --which" >&2
  exit 2
fi
engine=$(which_engine)
sub=$1
shift
limits=()
case "$sub" in
  build | run | create) limits=(--ulimit nofile=1024:1024 --ulimit nproc=1000:1000 --network=host) ;;
esac
if [[ "$engine" == podman ]]; then
  exec podman --runtime runc --cgroup-manager=cgroupfs "$sub" "${limits[@]}" "$@"
fi
exec docker "$sub" "${limits[@]}" "$@"
