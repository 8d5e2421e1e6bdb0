"""``cachescale audit run | compare | demo``: flags, files and exit codes.

The gate's exit codes (``cachescale.exit_codes``): 0 pass, 1 regression, 2 usage or input
error (a malformed corpus line, an empty corpus, an unreadable or incomparable result, an
``--out`` that cannot be written): a CI step can tell a broken change from a broken input;
live mode (``--endpoint``, ``audit/live.py``) adds 3, an engine it cannot reach. Every
error is one line on stderr. Building the parser imports only this module; the replay
(numpy, the simulator's engine) is imported when a subcommand runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachescale.exit_codes import ExitCode

if TYPE_CHECKING:
    from cachescale.audit.corpus import Corpus, EncodeChat
    from cachescale.audit.tokenizer import PinnedTokenizer

PROG = "cachescale audit"

#: ``--hash-algo`` choices (``audit/hashing.py`` keeps the same tuple; a test checks).
HASH_ALGOS = ("fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

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


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
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


def _run_flags_problem(args: argparse.Namespace) -> str | None:
    """Why ``audit run``'s flags cannot go together (None when they can)."""
    from cachescale.audit.replay import SGLANG_FLAGS

    if args.endpoint is None:
        if args.metrics_url is not None:
            return "--metrics-url needs --endpoint"
        vllm_only = (args.kv_blocks, args.hash_algo, args.vllm_version)
        if args.engine == "sglang" and any(flag is not None for flag in vllm_only):
            return SGLANG_FLAGS
        return None
    if args.kv_blocks is not None:
        return "--kv-blocks is for the offline replay: the engine's own pool bounds a live run"
    if args.engine != "vllm" or args.hash_algo is not None or args.vllm_version is not None:
        return (
            "--engine, --hash-algo and --vllm-version are for the offline replay: a live run "
            "reads the engine's own (from its /metrics)"
        )
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    if (problem := _run_flags_problem(args)) is not None:
        return _fail(problem)
    from cachescale.audit.corpus import CorpusError, read_corpus
    from cachescale.audit.hashing import HashAlgoError, default_algo
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
    chat = _chat_encoder(args, pinned)
    if isinstance(chat, str):
        return _fail(chat)
    try:
        corpus = read_corpus(Path(args.corpus), pinned.encode if pinned else None, chat[0])
    except CorpusError as error:
        return _fail(str(error))
    try:
        if args.endpoint is not None:  # live mode: audit/live.py
            from cachescale.audit.live import Live, LiveError, live_result

            metrics_url = args.metrics_url or args.endpoint.rstrip("/") + "/metrics"
            live = Live(
                args.endpoint,
                metrics_url,
                args.block_size,
                args.warmup_conversations,
                hit_fraction=args.hit_fraction,
                decode=pinned.decode if pinned else None,
            )
            try:
                result = live_result(
                    corpus, args.corpus, live, pinned.sha256 if pinned else None, chat[1]
                )
            except LiveError as error:
                print(f"{PROG}: {error}", file=sys.stderr)
                return error.code
        else:
            outcome = replay(
                corpus,
                args.block_size,
                args.kv_blocks,
                args.warmup_conversations,
                default_algo(args.vllm_version, args.hash_algo),
                args.engine,
                args.hit_fraction,
                pinned.decode if pinned else None,
            )
            result = build_result(
                corpus, args.corpus, outcome, pinned.sha256 if pinned else None, chat[1]
            )
    except CorpusError as error:  # about the corpus as a whole: name it
        return _fail(f"{args.corpus}: {error}")
    except HashAlgoError as error:
        return _fail(str(error))
    if args.baseline_corpus is not None:
        try:
            _against(args, result, corpus, pinned, chat[0])
        except CorpusError as error:
            return _fail(f"--baseline-corpus {error}")
    if (problem := _write(Path(args.out), dumps(result))) is not None:
        return _fail(f"--out {problem}")
    sys.stdout.write(render_run(result))
    return ExitCode.OK


def _against(
    args: argparse.Namespace,
    result: dict[str, Any],
    corpus: Corpus,
    pinned: PinnedTokenizer | None,
    encode_chat: EncodeChat | None,
) -> None:
    """Align the corpus with ``--baseline-corpus`` (read as the corpus was) into the result."""
    from cachescale.audit.against import against_baseline, attach
    from cachescale.audit.corpus import read_corpus

    base = read_corpus(Path(args.baseline_corpus), pinned.encode if pinned else None, encode_chat)
    decode = pinned.decode if pinned else None
    attach(result, *against_baseline(corpus, base, args.block_size, decode))


def _chat_encoder(
    args: argparse.Namespace, pinned: PinnedTokenizer | None
) -> tuple[EncodeChat | None, str | None] | str:
    """The ``messages`` encoder and its template's sha256 (None, None without a template),
    or why the chat flags cannot be used."""
    if args.chat_template is None and args.chat_template_config is None:
        return None, None
    from cachescale.audit.chat import ChatTemplateError, load_chat_template

    if pinned is None:
        return "--chat-template needs --tokenizer tokenizer.json to encode what it renders"
    template_file, config_file = args.chat_template, args.chat_template_config
    try:
        template = load_chat_template(
            Path(template_file) if template_file else None,
            Path(config_file) if config_file else None,
        )
    except ChatTemplateError as error:
        flag = "--chat-template" if template_file else "--chat-template-config"
        return f"{flag} {error}"
    render, encode = template.render, pinned.encode_rendered

    def encode_chat(messages: list[Any], tools: list[Any] | None) -> list[int]:
        return encode(render(messages, tools))

    return encode_chat, template.sha256


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
            "Replay a JSONL corpus of prompts through vLLM's block hashing and prefix cache "
            "or SGLang's radix cache (warm-up pass, then audit pass), say why prompts miss, "
            "and gate a candidate against a baseline. Exit codes: 0 pass, 1 regression, 2 "
            "usage or input error."
        ),
    )
    commands = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="replay a corpus and write a result JSON",
        description=(
            "Replay CORPUS (JSONL: conversation_id, turn, then prompt_token_ids, prompt text "
            "or chat messages, optional tenant and cache_salt) and write the figures and the "
            "classified causes to --out. The first half of the conversations warm the cache; "
            "the rest are audited."
        ),
    )
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
        "--block-size", type=_positive_int, default=16, metavar="N", help="tokens per block"
    )
    run.add_argument(
        "--kv-blocks",
        type=_positive_int,
        metavar="N",
        help="bound the pool as vLLM's --num-gpu-blocks-override N does: N blocks, one of "
        "them vLLM's null block, with vLLM's LRU eviction (default: unbounded)",
    )
    run.add_argument(
        "--hit-fraction",
        type=_share,
        default=0.8,
        metavar="X",
        help="a request hits when it takes at least this share of its prompt from the cache: "
        "the request hit share, and which requests are explained (default 0.8); recorded in "
        "settings, and compare refuses results with different ones",
    )
    run.add_argument(
        "--warmup-conversations",
        type=_positive_int,
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
