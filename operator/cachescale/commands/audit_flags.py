"""``cachescale audit run``'s flags: their value types and the argument list.

Kept apart from ``commands/audit.py`` (what each subcommand does) so neither passes
~400 lines; like it, this imports nothing heavy, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse

from cachescale.commands.flags import at_least_one

#: ``--hash-algo`` choices (``audit/hashing.py`` keeps the same tuple; a test checks).
HASH_ALGOS = ("fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def fraction(text: str) -> float:
    """A finite number of 0 or more (a gate's tolerance)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {text}")
    return value


def share(text: str) -> float:
    """A number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def http_url(text: str) -> str:
    """An http(s) URL with something after the scheme."""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text}")
    return text


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    """Every flag of ``audit run``."""
    run.add_argument(
        "corpus",
        metavar="CORPUS",
        help="JSONL corpus: token ids, prompt text (--tokenizer) or messages (a chat template)",
    )
    run.add_argument("--out", required=True, metavar="FILE", help="result JSON to write")
    run.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="a local tokenizer.json (Hugging Face tokenizers) for records that give 'prompt' "
        "text; its sha256 is recorded, and compare refuses results tokenized differently",
    )
    # What a record's messages, the cache's engine and its hash are.
    run.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template file for records that give 'messages' (+ 'tools'); "
        "its sha256 is recorded, and compare refuses results rendered differently",
    )
    run.add_argument(
        "--chat-template-config",
        metavar="FILE",
        help="a local tokenizer_config.json: its chat_template (unless --chat-template), "
        "and the bos_token and eos_token the template renders",
    )
    run.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        default="vllm",
        help="vllm: full blocks, chained hashes, first-miss lookup (default); sglang: the "
        "radix cache at page size 1, the longest common token prefix hits",
    )
    run.add_argument(
        "--hash-algo",
        choices=HASH_ALGOS,
        help="vLLM's --prefix-caching-hash-algo, byte-identical to vLLM's: sha256, "
        "sha256_cbor, xxhash, xxhash_cbor (cbor2, xxhash packages); or fast, the simulator's "
        "chain (the same hits, not vLLM's digests). Default: --vllm-version's default, else fast",
    )
    run.add_argument(
        "--vllm-version",
        metavar="X.Y.Z",
        help="the vLLM the corpus is for: its default --hash-algo (sha256 from 0.10.2; "
        "fast stands in for the builtin hash before), and the algorithms it has",
    )
    run.add_argument(
        "--block-size", type=at_least_one, default=16, metavar="N", help="tokens per block"
    )
    run.add_argument(
        "--kv-blocks",
        type=at_least_one,
        metavar="N",
        help="bound the pool as vLLM's --num-gpu-blocks-override N does: N blocks, one of "
        "them vLLM's null block, with vLLM's LRU eviction (default: unbounded)",
    )
    run.add_argument(
        "--hit-fraction",
        type=share,
        default=0.8,
        metavar="X",
        help="a request hits when it takes at least this share of its prompt from the cache: "
        "the request hit share, and which requests are explained (default 0.8); recorded in "
        "settings, and compare refuses results with different ones",
    )
    run.add_argument(
        "--warmup-conversations",
        type=at_least_one,
        metavar="N",
        help="conversations in the warm-up pass (default: half, rounded down)",
    )
    run.add_argument(
        "--baseline-corpus",
        metavar="FILE",
        help="the baseline's corpus: align every prompt with the baseline's of the same "
        "conversation and turn and say what changed (result's 'baseline' section)",
    )
    # Live mode (audit/live.py): the corpus against a running engine and its /metrics.
    run.add_argument(
        "--endpoint",
        type=http_url,
        metavar="URL",
        help="audit against this OpenAI-compatible server (POST URL/v1/completions, token-id "
        "prompts) and its prefix-cache counters, instead of the offline replay; exit 3 when "
        "it cannot be reached",
    )
    run.add_argument(
        "--metrics-url",
        type=http_url,
        metavar="URL",
        help="the engine's Prometheus metrics (default: ENDPOINT/metrics)",
    )
