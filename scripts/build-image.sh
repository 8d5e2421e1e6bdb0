#!/usr/bin/env bash
# Build the operator image from the Dockerfile without a Docker engine.
#
#   scripts/build-image.sh [--local-base] [TAG]
#
# TAG defaults to what the chart names: ghcr.io/cachescale/cachescale:<appVersion>.
# CONTAINER_TOOL (default: podman, else docker) builds it. With --local-base the base image
# is made here from Debian's packages (mmdebstrap, bookworm's python3) and imported as
# localhost/cachescale-base:bookworm, and the build pulls nothing (--pull=never): what CI
# does, on a machine that reaches package registries only. The host's CA bundle is mounted
# into the build's RUN steps (never into a layer), so pip trusts what the host trusts,
# e.g. a TLS-inspecting proxy. Prints the tag and the image's size in bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

local_base=false
if [[ "${1:-}" == "--local-base" ]]; then local_base=true; shift; fi
app_version="$(sed -n 's/^appVersion: *"*\([^"]*\)"*$/\1/p' charts/cachescale/Chart.yaml)"
tag="${1:-ghcr.io/cachescale/cachescale:${app_version}}"
tool="${CONTAINER_TOOL:-$(command -v podman >/dev/null && echo podman || echo docker)}"
base_image=localhost/cachescale-base:bookworm
bundle=/etc/ssl/certs/ca-certificates.crt

build=("$tool" build -t "$tag")
if $local_base; then
    if ! "$tool" image exists "$base_image" 2>/dev/null; then
        # What python:3.12-slim gives the Dockerfile: python, venv, libstdc++ (numpy's
        # wheels), useradd (passwd) and CA certificates; no docs, man pages or locales.
        mmdebstrap --variant=essential --quiet \
            --include=python3,python3-venv,python-is-python3,libstdc++6,passwd,ca-certificates \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            bookworm - | "$tool" import - "$base_image" >/dev/null
    fi
    build+=(--pull=never --build-arg "BASE_IMAGE=$base_image")
fi
if [[ "$tool" == podman ]]; then
    # chroot isolation: RUN steps need no OCI runtime (none may start in a sandbox).
    build+=(--isolation chroot)
    [[ -f "$bundle" ]] && build+=(--volume "$bundle:$bundle:ro")
fi
"${build[@]}" --quiet . >/dev/null
echo "$tag $("$tool" image inspect --format '{{.Size}}' "$tag")"
