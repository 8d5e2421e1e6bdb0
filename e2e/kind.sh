#!/usr/bin/env bash
# Bring up a kind cluster for the e2e suite and run it (needs Docker and kind).
#
#   e2e/kind.sh            # create the cluster (if missing), run `make e2e`
#   e2e/kind.sh --delete   # delete the cluster
#
# The operator runs out of cluster against this cluster's API; Prometheus and the
# emulated engines run on this machine (the tests start them), so no image is built.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${KIND_CLUSTER:-cachescale-e2e}"
KUBECONFIG_FILE="${KUBECONFIG_FILE:-$PWD/.tools/kind-$CLUSTER.kubeconfig}"

if [[ "${1:-}" == "--delete" ]]; then
    kind delete cluster --name "$CLUSTER"
    exit 0
fi

for tool in docker kind; do
    command -v "$tool" >/dev/null || { echo "e2e/kind.sh: $tool is required" >&2; exit 1; }
done

mkdir -p "$(dirname "$KUBECONFIG_FILE")"
if ! kind get clusters | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 120s
else
    kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
fi

make tools                                   # helm and kubectl into .tools/bin
export PATH="$PWD/.tools/bin:$PATH"
export KUBECONFIG="$KUBECONFIG_FILE"
make e2e
