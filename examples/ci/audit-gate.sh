#!/usr/bin/env bash
# The pre-merge prefix-cache gate for any CI: build the corpus on the base branch and on
# the change, audit both, compare, and leave the Markdown verdict for a review comment.
#
#   examples/ci/audit-gate.sh [BASE_REF [BUILD_CORPUS]]     # default: origin/main
#
# Environment (all optional):
#   BUILD_CORPUS   the script that writes a corpus: BUILD_CORPUS OUT.jsonl, run from the
#                  checkout being audited (default: examples/ci/build-corpus.sh of the change;
#                  the second argument, when given, wins)
#   AUDIT_FLAGS    extra flags for `cachescale audit run`, e.g. "--tokenizer tokenizer.json"
#                  or "--endpoint http://127.0.0.1:8000" (live mode: an engine of its own)
#   GATE_FLAGS     extra flags for `cachescale audit compare`, e.g. "--max-hit-rate-drop 0.02"
#   OUT_DIR        where the corpora, results and audit.md go (default: ./cachescale-audit)
#
# Exit status is compare's: 0 pass, 1 regression, 2 the audit could not run (3: live mode
# could not reach the engine). audit.md holds the comment to post either way.
set -euo pipefail

base_ref="${1:-origin/main}"
repo="$(git rev-parse --show-toplevel)"
out_dir="$(mkdir -p "${OUT_DIR:-cachescale-audit}" && cd "${OUT_DIR:-cachescale-audit}" && pwd)"
build="$(realpath "${2:-${BUILD_CORPUS:-$repo/examples/ci/build-corpus.sh}}")"
read -r -a audit_flags <<<"${AUDIT_FLAGS:-}"
read -r -a gate_flags <<<"${GATE_FLAGS:-}"

base_tree="$(mktemp -d)"
cleanup() {
    git -C "$repo" worktree remove --force "$base_tree" >/dev/null 2>&1 || true
    rm -rf "$base_tree"
}
trap cleanup EXIT
git -C "$repo" worktree add --detach "$base_tree" "$base_ref" >/dev/null

(cd "$base_tree" && "$build" "$out_dir/baseline.jsonl")
(cd "$repo" && "$build" "$out_dir/candidate.jsonl")

for side in baseline candidate; do
    cachescale audit run "$out_dir/$side.jsonl" --out "$out_dir/$side.json" \
        ${audit_flags[@]+"${audit_flags[@]}"}
done

status=0
cachescale audit compare "$out_dir/baseline.json" "$out_dir/candidate.json" \
    --format markdown ${gate_flags[@]+"${gate_flags[@]}"} >"$out_dir/audit.md" || status=$?
cat "$out_dir/audit.md"
exit "$status"
