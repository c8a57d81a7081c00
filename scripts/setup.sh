#!/usr/bin/env bash
# Installs kvgen's build dependencies from Debian packages (when missing) and configures and builds into build/.
# Idempotent and quick when everything is already there.
#
# Environment: KVGEN_BUILD_DIR (build), KVGEN_BUILD_TYPE (Release), KVGEN_CUDA (AUTO|ON|OFF),
#              KVGEN_CUDA_ARCHS (default: native when a GPU is visible, else 75;80;86;89;90), KVGEN_WERROR (OFF).
set -euo pipefail

usage() {
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"
    echo "usage: scripts/setup.sh [--no-build]"
}
build=1
for arg in "$@"; do
    case $arg in
        -h | --help) usage; exit 0 ;;
        --no-build) build=0 ;;
        *) echo "setup.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

packages=(cmake ninja-build g++ pkg-config libcli11-dev libfmt-dev libspdlog-dev catch2 nlohmann-json3-dev
    libpcre2-dev shellcheck unzip gnuplot-nox python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

((build)) || exit 0

build_dir=${KVGEN_BUILD_DIR:-build}
archs=${KVGEN_CUDA_ARCHS:-}
if [[ -z $archs ]]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then archs=native; else archs="75;80;86;89;90"; fi
fi
cmake -S . -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE="${KVGEN_BUILD_TYPE:-Release}" \
    -DKVGEN_CUDA="${KVGEN_CUDA:-AUTO}" \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    -DKVGEN_WERROR="${KVGEN_WERROR:-OFF}" >"$build_dir.configure.log" 2>&1 || {
    cat "$build_dir.configure.log" >&2
    exit 1
}
rm -f "$build_dir.configure.log"
if [[ ! -x $build_dir/kvgen ]]; then
    echo "setup: building kvgen into $build_dir/ (the first build compiles the CUDA kernels for each GPU" \
        "architecture: several minutes)" >&2
fi
cmake --build "$build_dir" -j "$(nproc)"
