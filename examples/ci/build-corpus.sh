#!/usr/bin/env bash
# Write the audit corpus of the app checked out in the current folder to "$1" (JSONL).
#
# REPLACE THIS SCRIPT. It is the one part of the gate only you can write: render the
# prompts your app sends, exactly as it sends them (chat template, tools, retrieval,
# history), for a fixed set of about 50 multi-turn conversations, one request per line:
#
#   {"conversation_id": "c7", "turn": 3, "prompt_token_ids": [128000, ...], "cache_salt": "t1"}
#
# (or "prompt" text, audited with --tokenizer tokenizer.json). The conversations and
# their order must be the same on main and on the pull request: only your app's code may
# differ. See docs/audit.md, "The corpus".
#
# Until then it writes a built-in demo corpus, so the workflow runs end to end (and
# passes: both sides get the same corpus).
set -euo pipefail

out="${1:?usage: build-corpus.sh OUT.jsonl}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

cachescale audit demo --case timestamp-top --out "$scratch" >/dev/null
cp "$scratch/baseline.jsonl" "$out"
