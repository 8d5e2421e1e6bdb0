#!/usr/bin/env bash
# The gate step of the composite GitHub Action (action.yml at the repository's root): run
# audit-gate.sh with the action's inputs, put the Markdown verdict in the job summary, and
# hand the exit status and the comment's path to the next steps (which comment, then fail).
#
# Environment, as action.yml sets it from the inputs:
#   INPUT_BASE_REF       the base to audit against (e.g. origin/main)
#   INPUT_BUILD_CORPUS   the script that writes a corpus, relative to the repository
#   INPUT_AUDIT_FLAGS    extra flags for `cachescale audit run`
#   INPUT_GATE_FLAGS     extra flags for `cachescale audit compare`
#   INPUT_OUT_DIR        where the corpora, results and audit.md go
#   GITHUB_OUTPUT, GITHUB_STEP_SUMMARY   the runner's files (a scratch file elsewhere)
#
# It exits 0 whatever the verdict: the status output (0 pass, 1 regression, 2 the audit
# could not run, 3 engine unreachable) is for the action's last step to fail on.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${INPUT_OUT_DIR:-cachescale-audit}"
status=0
OUT_DIR="$out_dir" AUDIT_FLAGS="${INPUT_AUDIT_FLAGS:-}" GATE_FLAGS="${INPUT_GATE_FLAGS:-}" \
    "$here/audit-gate.sh" "${INPUT_BASE_REF:?the base-ref input is required}" \
    "${INPUT_BUILD_CORPUS:?the build-corpus input is required}" || status=$?

comment="$out_dir/audit.md"
if [ -s "$comment" ] && [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$comment" >>"$GITHUB_STEP_SUMMARY"
fi
{
    echo "status=$status"
    echo "comment=$comment"
} >>"${GITHUB_OUTPUT:?set GITHUB_OUTPUT to the runner output file}"
