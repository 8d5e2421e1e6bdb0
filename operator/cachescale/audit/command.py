"""``cachescale audit run | compare | demo``: flags, files and exit codes.

The gate's exit codes (``api.exit_codes``): 0 pass, 1 regression, 2 usage or input error
(a malformed corpus line, an empty corpus, an unreadable or incomparable result, an
``--out`` that cannot be written): a CI step can tell a broken change from a broken
input; live mode (``--endpoint``, ``audit/live.py``) adds 3, an engine it cannot reach.
Every error is one line on stderr. Building the parser imports only this module; the
replay (numpy, the simulator's engine) is imported when a subcommand runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cachescale.api.exit_codes import ExitCode

PROG = "cachescale audit"

#: The demo cases (``audit/demo.py`` writes them; a test keeps the two lists equal).
DEMO_CASES = (
    "rechunk-retrieval-first",
    "boundary-shift-only",
    "timestamp-top",
    "shuffled-tools",
    "sliding-window",
    "prompt-doubled",
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {text}")
    return value


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text}")
    return text


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return ExitCode.USAGE


def _write(path: Path, text: str) -> str | None:
    """Write a file; why not, when it cannot be written."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        return f"{path}: cannot write: {error.strerror}"
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    if args.endpoint is None and args.metrics_url is not None:
        return _fail("--metrics-url needs --endpoint")
    if args.endpoint is not None and args.kv_blocks is not None:
        return _fail(
            "--kv-blocks is for the offline replay: the engine's own pool bounds a live run"
        )
    if args.endpoint is not None and args.metrics_url is None:
        args.metrics_url = args.endpoint.rstrip("/") + "/metrics"
    from cachescale.audit.corpus import CorpusError, read_corpus
    from cachescale.audit.replay import replay
    from cachescale.audit.result import build_result, dumps
    from cachescale.audit.summary import render_run

    pinned = None
    if args.tokenizer is not None:
        from cachescale.audit.tokenizer import TokenizerError, load_tokenizer

        try:
            pinned = load_tokenizer(Path(args.tokenizer))
        except TokenizerError as error:
            return _fail(f"--tokenizer {error}")
    try:
        corpus = read_corpus(Path(args.corpus), pinned.encode if pinned else None)
    except CorpusError as error:
        return _fail(str(error))
    try:
        if args.endpoint is not None:  # live mode: audit/live.py
            from cachescale.audit.live import Live, LiveError, live_result

            live = Live(args.endpoint, args.metrics_url, args.block_size, args.warmup_conversations)
            try:
                result = live_result(corpus, args.corpus, live, pinned.sha256 if pinned else None)
            except LiveError as error:
                print(f"{PROG}: {error}", file=sys.stderr)
                return error.code
        else:
            outcome = replay(corpus, args.block_size, args.kv_blocks, args.warmup_conversations)
            result = build_result(corpus, args.corpus, outcome, pinned.sha256 if pinned else None)
    except CorpusError as error:  # about the corpus as a whole: name it
        return _fail(f"{args.corpus}: {error}")
    if (problem := _write(Path(args.out), dumps(result))) is not None:
        return _fail(f"--out {problem}")
    sys.stdout.write(render_run(result))
    return ExitCode.OK


def _cmd_compare(args: argparse.Namespace) -> int:
    from cachescale.audit.compare import (
        Thresholds,
        compare,
        render_json,
        render_markdown,
        render_table,
    )
    from cachescale.audit.result import ResultError, incompatible, load_result

    try:
        baseline = load_result(Path(args.baseline))
        candidate = load_result(Path(args.candidate))
    except ResultError as error:
        return _fail(str(error))
    if (why := incompatible(baseline, candidate)) is not None:
        return _fail(f"the results are not comparable: {why}")
    verdict = compare(
        baseline,
        candidate,
        Thresholds(args.max_hit_rate_drop, args.max_recompute_rise, args.max_prompt_growth),
    )
    render = {"table": render_table, "json": render_json, "markdown": render_markdown}
    sys.stdout.write(render[args.format](verdict))
    return ExitCode.REGRESSION if verdict.regression else ExitCode.OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from cachescale.audit.demo import write_case

    folder = Path(args.out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = write_case(args.case, folder, args.seed)
    except OSError as error:
        return _fail(f"--out {args.out}: cannot write: {error.strerror}")
    for path in written:
        print(path)
    return ExitCode.OK


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit`` and its three subcommands."""
    audit = subparsers.add_parser(
        "audit",
        help="pre-merge prefix-cache regression gate: replay a corpus, compare two results",
        description=(
            "Replay a JSONL corpus of token-id prompts through vLLM's block hashing and "
            "prefix cache (warm-up pass, then audit pass), say why prompts miss, and gate a "
            "candidate against a baseline. Exit codes: 0 pass, 1 regression, 2 usage or "
            "input error."
        ),
    )
    commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="replay a corpus and write a result JSON",
        description=(
            "Replay CORPUS (JSONL: conversation_id, turn, prompt_token_ids, optional tenant "
            "and cache_salt) and write the figures and the classified causes to --out. The "
            "first half of the conversations warm the cache; the rest are audited."
        ),
    )
    run.add_argument(
        "corpus", metavar="CORPUS", help="JSONL corpus: token ids, or prompt text with --tokenizer"
    )
    run.add_argument("--out", required=True, metavar="FILE", help="result JSON to write")
    run.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="a local tokenizer.json (Hugging Face tokenizers) for records that give 'prompt' "
        "text; its sha256 is recorded, and compare refuses results tokenized differently",
    )
    run.add_argument(
        "--block-size", type=_positive_int, default=16, metavar="N", help="tokens per block"
    )
    run.add_argument(
        "--kv-blocks",
        type=_positive_int,
        metavar="N",
        help="bound the pool to N blocks with vLLM's LRU eviction (default: unbounded)",
    )
    run.add_argument(
        "--warmup-conversations",
        type=_positive_int,
        metavar="N",
        help="conversations in the warm-up pass (default: half, rounded down)",
    )
    # Live mode (audit/live.py): the corpus against a running engine and its /metrics.
    run.add_argument(
        "--endpoint",
        type=_http_url,
        metavar="URL",
        help="audit against this OpenAI-compatible server (POST URL/v1/completions, token-id "
        "prompts) and its prefix-cache counters, instead of the offline replay; exit 3 when "
        "it cannot be reached",
    )
    run.add_argument(
        "--metrics-url",
        type=_http_url,
        metavar="URL",
        help="the engine's Prometheus metrics (default: ENDPOINT/metrics)",
    )
    run.set_defaults(handler=_cmd_run)

    compare = commands.add_parser(
        "compare",
        help="gate a candidate result against a baseline result",
        description=(
            "Compare the audit passes of two results. Exit 0 pass, 1 regression, 2 usage or "
            "input error (including results with different settings)."
        ),
    )
    compare.add_argument("baseline", metavar="BASELINE", help="result JSON of main")
    compare.add_argument("candidate", metavar="CANDIDATE", help="result JSON of the change")
    compare.add_argument(
        "--max-hit-rate-drop",
        type=_fraction,
        default=0.05,
        metavar="X",
        help="largest allowed fall of the token hit rate, absolute (default 0.05)",
    )
    compare.add_argument(
        "--max-recompute-rise",
        type=_fraction,
        default=0.10,
        metavar="X",
        help="largest allowed rise of recomputed tokens per request, relative (default 0.10)",
    )
    compare.add_argument(
        "--max-prompt-growth",
        type=_fraction,
        default=0.25,
        metavar="X",
        help="largest allowed growth of prompt tokens per request, relative (default 0.25)",
    )
    compare.add_argument(
        "--format", choices=("table", "json", "markdown"), default="table", help="output"
    )
    compare.set_defaults(handler=_cmd_compare)

    demo = commands.add_parser(
        "demo",
        help="write a baseline and a candidate corpus for a built-in case",
        description="Write DIR/baseline.jsonl and DIR/candidate.jsonl (token ids, seeded).",
    )
    demo.add_argument("--case", required=True, choices=DEMO_CASES, help="the case")
    demo.add_argument("--out", required=True, metavar="DIR", help="folder to write into")
    demo.add_argument("--seed", type=int, default=0, metavar="N", help="random seed")
    demo.set_defaults(handler=_cmd_demo)
