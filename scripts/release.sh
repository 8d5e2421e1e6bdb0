#!/usr/bin/env bash
# `make release`: the wheel, the sdist and the packaged Helm chart of one version.
#
#   scripts/release.sh VERSION [OUT]      (OUT defaults to dist/)
#
# The release is of the committed tree (HEAD, via git archive), so nothing uncommitted
# ships. pyproject.toml and the package's __version__ are stamped with VERSION in a
# staging copy (never in the clone), and the chart is packaged with VERSION as both its
# version and its appVersion, so the image tag the chart names is the wheel's version.
# Prints each artefact with its size in bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:?usage: scripts/release.sh VERSION [OUT]}"
out="$(mkdir -p "${2:-dist}" && cd "${2:-dist}" && pwd)"
python="${PYTHON:-.venv/bin/python}"
helm="${HELM:-$(command -v helm || echo .tools/bin/helm)}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
git archive --format=tar HEAD | tar -x -C "$stage"
sed -i "s/^version = \".*\"$/version = \"$version\"/" "$stage/pyproject.toml"
sed -i "s/^__version__ = \".*\"$/__version__ = \"$version\"/" "$stage/operator/cachescale/__init__.py"
grep -q "^version = \"$version\"$" "$stage/pyproject.toml"

"$python" -m build --sdist --wheel --outdir "$out" "$stage" >"$stage/build.log" 2>&1 \
    || { cat "$stage/build.log" >&2; exit 1; }
"$helm" package "$stage/charts/cachescale" --version "$version" --app-version "$version" \
    --destination "$out" >/dev/null
for artefact in "cachescale-$version-py3-none-any.whl" "cachescale-$version.tar.gz" \
        "cachescale-$version.tgz"; do
    [[ -f "$out/$artefact" ]] || { echo "release: $artefact was not made" >&2; exit 1; }
    printf '%s %s\n' "$out/$artefact" "$(stat -c %s "$out/$artefact")"
done
