#!/usr/bin/env bash
# Unpack the envtest binaries (etcd, kube-apiserver, kube-controller-manager) into a cache
# directory outside the repository and print that directory: the value for
# KUBEBUILDER_ASSETS, controller-runtime's convention, which the e2e harness reads.
#
# Usage: scripts/envtest-assets.sh [SOURCE]   (default SOURCE: ../shared/envtest)
#
# SOURCE holds NAME.xz files and a SHA256SUMS over them (read-only; never written). The
# checksums are verified before anything is unpacked; the cache directory is named after
# the SHA256SUMS file's own digest, so new binaries land in a new directory and a cached
# unpack is reused as it is (about 10 s of xz saved per run). Prints nothing and exits 3
# when SOURCE does not exist, so callers can fall back to skipping the e2e suite.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SOURCE="${1:-$ROOT/../shared/envtest}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cachescale/envtest"

say() { printf 'envtest-assets: %s\n' "$*" >&2; }

if [[ ! -f "$SOURCE/SHA256SUMS" ]]; then
    say "no $SOURCE/SHA256SUMS: no envtest binaries to unpack"
    exit 3
fi
key="$(sha256sum "$SOURCE/SHA256SUMS" | cut -c1-16)"
target="$CACHE/$key"
if [[ -f "$target/.complete" ]]; then
    printf '%s\n' "$target"
    exit 0
fi

(cd "$SOURCE" && sha256sum --quiet -c SHA256SUMS) || { say "checksum mismatch in $SOURCE"; exit 1; }
mkdir -p "$CACHE"
partial="$(mktemp -d "$CACHE/.partial.XXXXXX")"
trap 'rm -rf "$partial"' EXIT
while read -r _ file; do
    name="${file%.xz}"
    xz -dc "$SOURCE/$file" > "$partial/$name"
    chmod +x "$partial/$name"
done < "$SOURCE/SHA256SUMS"
touch "$partial/.complete"
rm -rf "$target"
mv "$partial" "$target"
trap - EXIT
say "unpacked $(ls "$target" | tr '\n' ' ')into $target"
printf '%s\n' "$target"
