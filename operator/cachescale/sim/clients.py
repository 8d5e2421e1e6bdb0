"""Closed-loop chat clients: each sends its conversation's next turn when its last answer
arrives (the ``clients`` part of a scenario).

The open-loop request stream (:mod:`cachescale.sim.traffic`) sends at a rate whatever the
engine does; a benchmark client, or a fixed number of users, does not: ``count`` clients
each hold one conversation at a time and send its next turn once the previous answer is
back, after ``think_time_s``. Load then follows the engine's speed, and ``--max-num-seqs``
below ``count`` makes requests queue.

A conversation starts with one of ``systems`` system prompts shared by every conversation
and a first user message of its own; each later turn is the previous prompt, the answer the
client received and a new user message, so every turn's prompt begins with the one before
it. It lasts a number of turns drawn from ``turns``. A turn whose prompt and output would
pass ``max_model_len`` is never sent (vLLM refuses such a request): the conversation ends
there and the client starts a new one in its place, as a chat client does when the
context is full. Lengths are drawn uniformly from inclusive ranges. What the clients send
is declared in :mod:`cachescale.sim.clients_spec`, the schema scenario files validate
against.

:class:`ChatClient` is one client's conversations, seeded by the scenario's seed and the
client's index, and told its answers: the referee suite drives real vLLM with the same
clients, so both see the same prompts turn for turn (token ids in a small vocabulary a tiny
model has). :class:`ClosedLoopClients` is the simulator's request source: it draws each
answer's tokens itself and hashes prompt and answer as the engine will cache them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from heapq import heappop, heappush

import numpy as np

from cachescale.sim.clients_spec import ClientsSpec
from cachescale.sim.hashing import hash_blocks
from cachescale.sim.request import SimRequest

FIRST_TOKEN_ID = 3
"""Token ids are drawn from ``[FIRST_TOKEN_ID, LAST_TOKEN_ID]``: past a Llama tokenizer's
special ids (``<unk>``, ``<s>``, ``</s>``) and within a 512-token vocabulary."""
LAST_TOKEN_ID = 499
DROPPED_RETRY_S = 1.0
"""A client whose request found no ready pod tries its next turn this much later."""


Turn = tuple[list[int], int]
"""One request: the prompt's token ids and the tokens to generate."""


def system_prompts(spec: ClientsSpec, seed: int) -> list[list[int]]:
    """The system prompts every client shares."""
    rng = random.Random(f"{seed}:systems")
    return [_tokens(rng, spec.system_tokens, spec.system_tokens) for _ in range(spec.systems)]


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randint(FIRST_TOKEN_ID, LAST_TOKEN_ID) for _ in range(rng.randint(low, high))]


class ChatClient:
    """One client's conversations, turn by turn: ``next_turn``, then ``answered``."""

    def __init__(
        self,
        spec: ClientsSpec,
        systems: Sequence[list[int]],
        seed: int,
        index: int,
        max_model_len: int,
    ) -> None:
        self._spec = spec
        self._systems = systems
        self._rng = random.Random(f"{seed}:client:{index}")
        self._max_len = max_model_len
        self._history: list[int] = []
        self._prompt: list[int] = []
        self._turns_left = 0
        self.system = 0
        """The system prompt of the current conversation."""
        self.restarts = 0
        """Conversations ended early because the next turn would not fit max_model_len."""

    def next_turn(self) -> Turn:
        """The next request: the current conversation's next turn, or a new conversation's
        first when it is over or its next turn would pass ``max_model_len``."""
        spec, rng = self._spec, self._rng
        if self._turns_left > 0:
            prompt = self._history + _tokens(rng, *spec.user_tokens)
            max_tokens = rng.randint(*spec.output_tokens)
            if len(prompt) + max_tokens <= self._max_len:
                return self._send(prompt, max_tokens)
            self.restarts += 1
        self._turns_left = rng.randint(*spec.turns)
        self.system = rng.randrange(len(self._systems))
        prompt = self._systems[self.system] + _tokens(rng, *spec.first_user_tokens)
        return self._send(prompt, rng.randint(*spec.output_tokens))

    def _send(self, prompt: list[int], max_tokens: int) -> Turn:
        self._turns_left -= 1
        self._prompt = prompt
        return prompt, max_tokens

    def answered(self, output: Sequence[int]) -> None:
        """The last turn's answer arrived (empty if it failed): it joins the history."""
        self._history = [*self._prompt, *output]


def token_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as the simulator hashes them (little-endian int32)."""
    return np.asarray(ids, dtype="<i4").tobytes()


class ClosedLoopClients:
    """The simulator's closed-loop request source.

    ``next_arrival_s`` is when the next request will be sent (infinity while every client
    waits for an answer or past ``until_s``), ``take`` makes it; ``answered`` and
    ``dropped`` tell a client its request's outcome, and it sends again after
    ``think_time_s`` (``DROPPED_RETRY_S`` after a drop). Every client sends its first turn
    at time 0.
    """

    def __init__(
        self, spec: ClientsSpec, seed: int, block_size: int, max_model_len: int, until_s: float
    ) -> None:
        systems = system_prompts(spec, seed)
        self._spec = spec
        self._clients = [
            ChatClient(spec, systems, seed, i, max_model_len) for i in range(spec.count)
        ]
        self._answers = [random.Random(f"{seed}:answers:{i}") for i in range(spec.count)]
        self._block_size = block_size
        self._until_s = until_s
        self._ready: list[tuple[float, int]] = [(0.0, i) for i in range(spec.count)]
        self._asked: dict[int, tuple[int, list[int]]] = {}
        self._next_id = 0

    @property
    def clients(self) -> list[ChatClient]:
        """The clients, by index."""
        return self._clients

    def next_arrival_s(self) -> float:
        """When the next request is sent (infinity if none is due by ``until_s``)."""
        if not self._ready or self._ready[0][0] > self._until_s:
            return float("inf")
        return self._ready[0][0]

    def take(self) -> SimRequest:
        """The next request, from the client whose turn is due first."""
        at_s, index = heappop(self._ready)
        client = self._clients[index]
        prompt, max_tokens = client.next_turn()
        rng = self._answers[index]
        answer = [rng.randint(FIRST_TOKEN_ID, LAST_TOKEN_ID) for _ in range(max_tokens)]
        request = SimRequest(
            request_id=self._next_id,
            arrival_s=at_s,
            tenant="default",
            prefix_group=client.system,
            prompt_tokens=len(prompt),
            output_tokens=max_tokens,
            block_hashes=hash_blocks(token_bytes([*prompt, *answer]), self._block_size),
            max_tokens=max_tokens,
        )
        self._asked[request.request_id] = (index, answer)
        self._next_id += 1
        return request

    def answered(self, request: SimRequest, now_s: float) -> None:
        """``request`` finished (or was aborted) by ``now_s``: its client goes on."""
        asked = self._asked.pop(request.request_id, None)
        if asked is None:
            return
        index, answer = asked
        finished = request.finished_s
        self._clients[index].answered(answer if finished is not None else [])
        at_s = max(now_s, finished if finished is not None else now_s)
        heappush(self._ready, (at_s + self._spec.think_time_s, index))

    def dropped(self, request: SimRequest, now_s: float) -> None:
        """No pod took ``request``: its client tries its next turn later."""
        index, _ = self._asked.pop(request.request_id)
        self._clients[index].answered([])
        heappush(self._ready, (now_s + DROPPED_RETRY_S, index))
