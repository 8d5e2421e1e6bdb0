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

from cachescale.commands.audit_flags import add_run_arguments, fraction
from cachescale.exit_codes import ExitCode

if TYPE_CHECKING:
    from cachescale.audit.corpus import Corpus, EncodeChat
    from cachescale.audit.tokenizer import PinnedTokenizer

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
    add_run_arguments(run)
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
        type=fraction,
        default=0.05,
        metavar="X",
        help="largest allowed fall of the token hit rate, absolute (default 0.05)",
    )
    compare.add_argument(
        "--max-recompute-rise",
        type=fraction,
        default=0.10,
        metavar="X",
        help="largest allowed rise of recomputed tokens per request, relative (default 0.10)",
    )
    compare.add_argument(
        "--max-prompt-growth",
        type=fraction,
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
