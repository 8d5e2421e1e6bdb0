"""Chat-like load for a real vLLM: multi-turn sessions over token ids, closed loop.

A session starts with one of a few system prompts shared by every session, then a user
message of its own; each later turn is the previous prompt plus an assistant reply and a
new user message, so every turn's prompt begins with the one before it. vLLM's prefix
cache therefore hits the shared system prompts and the history and misses each new
message: the token hit rate lies strictly between 0 and 1, and some requests are full hits
while others compute hundreds of tokens. Prompts are token ids sent to
``/v1/completions`` (no tokenizer in the loop), below the model's context length with
their output.

``clients`` sessions run at once, more than ``--max-num-seqs`` so requests queue; each
client sends its next turn when the last answer arrives, and stops at the deadline.
Sessions are drawn in a seeded order, so a run's prompts depend only on the seed and how
many requests the engine completed before the deadline.

Setting ``stamp`` switches the template mid-run, the classic prefix collapse: from then
on every prompt is sent as ``timestamp_at_top`` renders it, the request's time (to the
millisecond) above the system prompt, so no request shares even its first block with
another and every turn re-sends its history behind a new prefix. Setting ``stop`` ends
the run early.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from referee.vllm import VllmServer

FIRST_TOKEN_ID = 3
"""Below it: the tiny model's special tokens (``<unk>``, ``<s>``, ``</s>``)."""
LAST_TOKEN_ID = 499
"""Within the tiny model's vocabulary of 512."""
TIME_HEADER = (FIRST_TOKEN_ID + 10, FIRST_TOKEN_ID + 11, FIRST_TOKEN_ID + 12)
"""The template's "Current time:" before the digits of the time."""

Span = tuple[int, int]
"""An inclusive range to draw a length from."""


@dataclass(frozen=True)
class ChatLoad:
    """The shape of the load: how many clients, and how long each part of a chat is."""

    clients: int = 10
    systems: int = 3
    """System prompts, shared by every session (the cross-session prefix hits)."""
    system_tokens: int = 160
    first_user_tokens: Span = (64, 256)
    reply_tokens: Span = (16, 64)
    user_tokens: Span = (16, 96)
    turns: Span = (2, 6)
    max_tokens: Span = (4, 16)
    """Tokens generated per request (EOS ignored), more than one so decode steps exist."""
    max_prompt_tokens: int = 896
    """A session ends before its prompt grows past this (the engine's max-model-len 1024
    minus the largest output)."""
    seed: int = 0


Turn = tuple[list[int], int]
"""One request: the prompt's token ids and the tokens to generate."""


def _tokens(rng: random.Random, span: Span) -> list[int]:
    return [rng.randint(FIRST_TOKEN_ID, LAST_TOKEN_ID) for _ in range(rng.randint(*span))]


def sessions(load: ChatLoad) -> Iterator[list[Turn]]:
    """Sessions without end, each its turns in order; seeded by ``load.seed``."""
    rng = random.Random(load.seed)
    systems = [_tokens(rng, (load.system_tokens, load.system_tokens)) for _ in range(load.systems)]
    while True:
        prompt = rng.choice(systems) + _tokens(rng, load.first_user_tokens)
        turns: list[Turn] = []
        for _ in range(rng.randint(*load.turns)):
            if len(prompt) > load.max_prompt_tokens:
                break
            turns.append((prompt, rng.randint(*load.max_tokens)))
            prompt = prompt + _tokens(rng, load.reply_tokens) + _tokens(rng, load.user_tokens)
        yield turns


def timestamp_at_top(prompt: list[int], at: float) -> list[int]:
    """``prompt`` as a template that writes the time ``at`` above the system prompt renders
    it: ``TIME_HEADER``, then the Unix time to the millisecond, a token a digit."""
    digits = f"{at:.3f}".replace(".", "")
    return [*TIME_HEADER, *(FIRST_TOKEN_ID + int(digit) for digit in digits), *prompt]


@dataclass
class LoadRun:
    """What a run sent: when it started and ended, the requests answered, the failures."""

    started: float
    ended: float = 0.0
    requests: int = 0
    failures: list[str] = field(default_factory=list)


class _Clients:
    """The clients' shared state: the session source and the run's record."""

    def __init__(
        self,
        server: VllmServer,
        load: ChatLoad,
        until: float,
        stamp: threading.Event,
        stop: threading.Event,
    ) -> None:
        self._server = server
        self._until = until
        self._stamp = stamp
        self._stop = stop
        self._sessions = sessions(load)
        self._lock = threading.Lock()
        self.run = LoadRun(started=time.time())

    def _next_session(self) -> list[Turn]:
        with self._lock:
            return next(self._sessions)

    def _running(self) -> bool:
        return time.time() < self._until and not self._stop.is_set()

    def _rendered(self, prompt: list[int]) -> list[int]:
        return timestamp_at_top(prompt, time.time()) if self._stamp.is_set() else prompt

    def client(self) -> None:
        """Send sessions turn by turn until the deadline or ``stop``; stop at the first
        failure."""
        while self._running():
            for prompt, max_tokens in self._next_session():
                if not self._running():
                    return
                try:
                    self._server.complete(self._rendered(prompt), max_tokens)
                except OSError as error:  # URLError, HTTPError, timeouts, a reset
                    with self._lock:
                        self.run.failures.append(f"{type(error).__name__}: {error}")
                    return
                with self._lock:
                    self.run.requests += 1


def drive(
    server: VllmServer,
    load: ChatLoad,
    until: float,
    stamp: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> LoadRun:
    """Run ``load`` against ``server`` until Unix time ``until`` or ``stop``, its prompts
    stamped (``timestamp_at_top``) once ``stamp`` is set; return the record once every
    client has had its last answer."""
    clients = _Clients(server, load, until, stamp or threading.Event(), stop or threading.Event())
    with ThreadPoolExecutor(load.clients, thread_name_prefix="chat-client") as pool:
        for future in [pool.submit(clients.client) for _ in range(load.clients)]:
            future.result()
    clients.run.ended = time.time()
    return clients.run
