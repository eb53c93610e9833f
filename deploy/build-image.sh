#!/usr/bin/env bash
# Builds the rlfleet image (deploy/Dockerfile) from the repository.
#
#   deploy/build-image.sh [--offline] [--gpu] [--tag NAME] [--cache DIR]
#
# Default: `docker build` on python:3.11-slim (pulled from a registry) with pip installing from PyPI.
# --gpu: TensorFlow's GPU build (pyproject's extra `gpu`, CUDA libraries included) in place of the CPU one; the
# tag defaults to rlfleet:gpu. Run it with deploy/gpu.yml on a machine with an NVIDIA GPU.
# --offline: no image registry needed. The base image is made locally with Debian's mmdebstrap (Debian bookworm,
# Python 3.11, from the Debian package mirror) and `docker import`; the dependency wheels are collected on this
# machine into wheelhouse/ (pip wheel, with this machine's python3.11) and the image installs only from them.
# The base tarball and the wheelhouse are kept in the cache folder (default ~/.cache/rlfleet-image) and reused.
# Needs: docker (DOCKER_HOST is honoured), and for --offline mmdebstrap and python3.11 with pip.
set -euo pipefail
cd "$(dirname "$0")/.."

offline=0
extra=cpu
tag=
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rlfleet-image"
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) offline=1 ;;
    --gpu) extra=gpu ;;
    --tag) tag="${2:?--tag needs an image name}"; shift ;;
    --cache) cache="${2:?--cache needs a folder}"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -z "$tag" ]; then
  if [ "$extra" = gpu ]; then tag=rlfleet:gpu; else tag=rlfleet:latest; fi
fi
if [ "$offline" = 0 ]; then  # a wheelhouse/ left in the repository would be used (and only it)
  exec docker build --build-arg TF_EXTRA="$extra" -f deploy/Dockerfile -t "$tag" .
fi

for tool in docker mmdebstrap python3.11; do
  command -v "$tool" >/dev/null || { echo "build-image.sh --offline needs $tool (apt-get install docker.io mmdebstrap)" >&2; exit 2; }
done
mkdir -p "$cache"

# with_progress LABEL PATH CMD...: runs CMD, and every 10 s prints how many MB it has written to PATH (a file or
# a folder) and at what rate; where an earlier build recorded the size PATH reached ($cache/sizes), also the time
# left. The size reached is recorded when CMD succeeds.
with_progress() {
  local label="$1" path="$2"; shift 2
  local before; before="$(awk -v l="$label" -F'\t' '$1 == l {print $2}' "$cache/sizes" 2>/dev/null | tail -1 || true)"
  "$@" &
  local pid=$! start=$SECONDS
  local tick=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    tick=$((tick + 1))
    [ $((tick % 10)) = 0 ] && kill -0 "$pid" 2>/dev/null || continue
    local mb elapsed
    mb="$(du -sm "$path" 2>/dev/null | cut -f1 || true)"; mb="${mb:-0}"
    elapsed=$((SECONDS - start))
    awk -v l="$label" -v mb="$mb" -v t="$elapsed" -v before="${before:-0}" 'BEGIN {
      rate = t > 0 ? mb / t : 0
      line = sprintf("build-image.sh: progress: %s: %d MB in %d s (%.1f MB/s)", l, mb, t, rate)
      if (before > mb && rate > 0) line = line sprintf(", about %d s left (an earlier build reached %d MB)", (before - mb) / rate, before)
      print line }'
  done
  wait "$pid" || return $?
  printf '%s\t%s\n' "$label" "$(du -sm "$path" 2>/dev/null | cut -f1)" >>"$cache/sizes"
}

base=rlfleet-base:bookworm
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [ ! -s "$cache/base.tar" ]; then
    echo "build-image.sh: making the base image (Debian bookworm, Python 3.11) with mmdebstrap"
    with_progress "base image" "$cache/base.tar.part" \
      mmdebstrap --quiet --format=tar --variant=apt --include=python3,python3-venv,ca-certificates,passwd \
      bookworm "$cache/base.tar.part"
    mv "$cache/base.tar.part" "$cache/base.tar"
  fi
  docker import "$cache/base.tar" "$base" >/dev/null
fi
# The wheels fit this machine's Python and platform: the cache is keyed by those and the dependency set.
stamp="$( (cat pyproject.toml; echo "$extra"; python3.11 -c 'import platform, sys; print(sys.version, platform.machine())') \
  | sha256sum | cut -c1-16)"
wheels="$cache/wheelhouse-$extra"
if [ ! -f "$wheels/.$stamp" ]; then
  echo "build-image.sh: collecting the dependency wheels (TensorFlow build: $extra)"
  rm -rf "$wheels"
  # the build backend too: the image builds rlfleet itself from source, offline
  with_progress "dependency wheels" "$wheels" \
    python3.11 -m pip wheel --quiet --wheel-dir "$wheels" ".[$extra]" "setuptools>=64" wheel
  touch "$wheels/.$stamp"
fi
trap 'rm -rf wheelhouse' EXIT
rm -rf wheelhouse
cp -r "$wheels" wheelhouse
docker build --build-arg BASE_IMAGE="$base" --build-arg TF_EXTRA="$extra" -f deploy/Dockerfile -t "$tag" .
docker image inspect "$tag" --format "build-image.sh: built $tag ({{.Size}} bytes)"
