"""What a scenario's request stream is made of: the declarative workload and its changes.

These frozen pydantic models are the ``workload`` part of a scenario file and its workload
perturbations: which segments a prompt has and in which order (``layout``), the tools,
tenants, RAG corpus and retrieval, sessions, token lengths and arrival rates, and the
:data:`Perturbation` union — re-chunking, retrieval re-run ahead of the history, the
variable field moved to the top, shuffled tools, a sliding history window, a new rate or
layout — each taking effect at its ``at_s``. They validate and hold values; nothing here
draws, generates or hashes. :class:`TrafficState` is the spec as the perturbations applied
so far have changed it: what a request arriving at a given time is made with.

They are kept apart from the generator that turns them into requests
(:mod:`cachescale.sim.traffic`) because they are a schema, not a mechanism: the scenario
schema (:mod:`cachescale.sim.scenario`) embeds them and validates files against them
without the token, session and hashing machinery, and the generator only consumes them.
:func:`incident_workload_spec` and :func:`incident_perturbations` spell out the incident
cachescale answers (a RAG corpus re-chunked under a fleet scaled on its queue) in these
terms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

SegmentKind = Literal["variable", "tools", "system", "docs", "history", "user"]
"""One part of a prompt; a layout orders them."""

RetrievalMode = Literal["per_topic", "per_session", "per_request"]
"""When retrieval runs, hence which requests share the same chunks in the same order."""


def _check_layout(layout: tuple[SegmentKind, ...]) -> tuple[SegmentKind, ...]:
    if len(set(layout)) != len(layout):
        raise ValueError(f"layout lists a segment twice: {list(layout)}")
    if "user" not in layout:
        raise ValueError("layout must contain the 'user' segment")
    return layout


Layout = Annotated[tuple[SegmentKind, ...], AfterValidator(_check_layout)]
"""Segment kinds in prompt order, each at most once, ``user`` required."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LengthDist(_Model):
    """A token count drawn from a lognormal distribution, rounded and clipped."""

    mean_tokens: float = Field(gt=0, description="Mean of the lognormal before clipping.")
    sigma: float = Field(
        default=0.5, ge=0, description="Shape (std of the log); 0 makes the count constant."
    )
    min_tokens: int = Field(default=1, ge=1, description="Lower clip.")
    max_tokens: int = Field(default=4096, ge=1, description="Upper clip.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self


class RateStep(_Model):
    """From ``at_s`` on, requests arrive at ``rate_per_s`` (Poisson)."""

    at_s: float = Field(ge=0, description="Simulated time the step takes effect, seconds.")
    rate_per_s: float = Field(ge=0, description="Mean arrivals per second from then on.")


class ToolsSpec(_Model):
    """Tool (function) definitions rendered into every prompt."""

    count: int = Field(default=6, ge=0, description="Number of tool definitions.")
    tokens_each: int = Field(default=200, ge=1, description="Tokens per tool definition.")
    shuffle: bool = Field(
        default=False,
        description="Render the tools in a fresh random order per request (nondeterministic "
        "serialisation); defeats sharing of everything after the first tool.",
    )


class TenantSpec(_Model):
    """A tenant: its own system prompt, optionally its own cache namespace."""

    name: str = Field(min_length=1, description="Tenant name, copied to SimRequest.tenant.")
    weight: float = Field(default=1.0, gt=0, description="Relative share of new sessions.")
    cache_salt: str | None = Field(
        default=None,
        min_length=1,
        description="vLLM cache_salt mixed into block 0's hash: tenants with different "
        "salts never share a block, even with identical tokens.",
    )


class RetrievalSpec(_Model):
    """The RAG corpus and how chunks are retrieved into the ``docs`` segment."""

    topics: int = Field(default=500, ge=1, description="Number of topics (prefix groups).")
    zipf_exponent: float = Field(
        default=0.8, ge=0, description="Topic popularity ∝ 1/rank^exponent; 0 is uniform."
    )
    docs_per_topic: int = Field(default=16, ge=1, description="Documents per topic.")
    tokens_per_doc: int = Field(
        default=2048, ge=1, description="Mean tokens per document (each is 0.5–1.5× this)."
    )
    chunk_size: int = Field(
        default=512,
        ge=1,
        description="Tokens per chunk: chunk i of a doc is doc[i*chunk_size:(i+1)*chunk_size].",
    )
    top_k: int = Field(default=4, ge=0, description="Chunks retrieved per request.")
    mode: RetrievalMode = Field(
        default="per_session",
        description="per_topic: a topic always retrieves the same chunks in the same order "
        "(shareable across sessions). per_session: retrieval runs on a session's first turn "
        "and its chunks are kept for the following turns. per_request: retrieval is re-run "
        "every turn. per_session and per_request draw top_k of the topic's chunks in a "
        "random order.",
    )


class SessionSpec(_Model):
    """Multi-turn conversations: follow-ups carry the previous turns as history."""

    mean_turns: float = Field(
        default=3.5,
        ge=1,
        description="Mean turns per session. A request continues a session with "
        "probability 1 − 1/mean_turns (0.71 for 3.5); session lengths are then geometric.",
    )
    concurrent: int = Field(
        default=256,
        ge=1,
        description="Conversations in flight. A follow-up continues one of them at random; "
        "a new session replaces one at random (that conversation ends). Sets the time "
        "between a session's turns: ≈ concurrent / (rate × (1 − 1/mean_turns)).",
    )
    history_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Sliding window: drop the oldest whole turns while the history exceeds "
        "this many tokens. None keeps the whole history.",
    )


class WorkloadSpec(_Model):
    """Everything that shapes the request stream (the ``workload`` part of a scenario)."""

    rate_per_s: float = Field(default=32.0, ge=0, description="Arrival rate at t=0, req/s.")
    rate_steps: tuple[RateStep, ...] = Field(
        default=(), description="Later rate changes (Poisson arrivals at each rate)."
    )
    layout: Layout = Field(
        default=("tools", "system", "docs", "history", "user", "variable"),
        description="Segment order. Segments before 'history' are re-rendered every turn; "
        "those after it form the turn, which joins the history with its output. Without "
        "'history' nothing carries over between a session's turns.",
    )
    tools: ToolsSpec = Field(default_factory=ToolsSpec, description="Tool definitions.")
    system_tokens: int = Field(
        default=800, ge=1, description="Tokens of each tenant's system prompt."
    )
    tenants: tuple[TenantSpec, ...] = Field(
        default=(TenantSpec(name="default"),),
        min_length=1,
        description="Tenants; each has its own system prompt.",
    )
    retrieval: RetrievalSpec = Field(
        default_factory=RetrievalSpec, description="RAG corpus and retrieval."
    )
    sessions: SessionSpec = Field(default_factory=SessionSpec, description="Multi-turn sessions.")
    user_tokens: LengthDist = Field(
        default=LengthDist(mean_tokens=110, sigma=0.4, min_tokens=50, max_tokens=200),
        description="Tokens of the user turn (unique per request).",
    )
    variable_tokens: int = Field(
        default=24, ge=1, description="Tokens of the variable field (unique per request)."
    )
    output_tokens: LengthDist = Field(
        default=LengthDist(mean_tokens=220, sigma=0.25, min_tokens=150, max_tokens=300),
        description="Tokens the request generates (unique; cached for the next turn).",
    )
    block_size: int = Field(default=16, ge=1, description="KV block size in tokens (vLLM).")
    client_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Clients give up on a request still queued, without output, this many "
        "seconds after it arrived: the engine aborts it (finished_reason=abort). None: "
        "clients wait forever.",
    )

    @model_validator(mode="after")
    def _unique_tenants(self) -> Self:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique: {names}")
        return self


# --- Perturbations ---------------------------------------------------------------------


class _Perturbation(_Model):
    at_s: float = Field(ge=0, description="Simulated time the change takes effect, seconds.")


class ChunkSizeChange(_Perturbation):
    """Re-chunk the corpus: same docs, new boundaries, so new chunk tokens (heals once)."""

    kind: Literal["chunk_size"] = Field(default="chunk_size", description="Discriminator.")
    chunk_size: int = Field(ge=1, description="New chunk size in tokens.")


class RetrievalAheadOfHistory(_Perturbation):
    """Retrieval re-runs every turn (``per_request``) and the docs move before the history."""

    kind: Literal["retrieval_per_turn_ahead_of_history"] = Field(
        default="retrieval_per_turn_ahead_of_history", description="Discriminator."
    )


class VariableFieldToTop(_Perturbation):
    """The variable field (timestamp / request id) moves to position 0 of the layout."""

    kind: Literal["variable_field_to_top"] = Field(
        default="variable_field_to_top", description="Discriminator."
    )


class ShuffleTools(_Perturbation):
    """Tool definitions are serialised in a random order per request."""

    kind: Literal["shuffle_tools"] = Field(default="shuffle_tools", description="Discriminator.")


class SlidingWindow(_Perturbation):
    """The history is truncated to the newest turns fitting in ``history_max_tokens``."""

    kind: Literal["sliding_window"] = Field(default="sliding_window", description="Discriminator.")
    history_max_tokens: int = Field(ge=1, description="History budget in tokens.")


class RateChange(_Perturbation):
    """The arrival rate changes (overrides ``rate_steps`` from ``at_s`` on)."""

    kind: Literal["rate"] = Field(default="rate", description="Discriminator.")
    rate_per_s: float = Field(ge=0, description="New mean arrivals per second.")


class LayoutChange(_Perturbation):
    """The prompt template changes: a new segment order."""

    kind: Literal["layout"] = Field(default="layout", description="Discriminator.")
    layout: Layout = Field(description="New segment order.")


WorkloadChange = (
    ChunkSizeChange
    | RetrievalAheadOfHistory
    | VariableFieldToTop
    | ShuffleTools
    | SlidingWindow
    | RateChange
    | LayoutChange
)
"""Every kind of workload change (a scenario adds its fleet events to these)."""

Perturbation = Annotated[WorkloadChange, Field(discriminator="kind")]
"""A workload change at a point in simulated time, tagged by ``kind``."""


# --- Perturbations applied -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrafficState:
    """The request stream's effective settings at one instant (spec + perturbations so far)."""

    layout: tuple[SegmentKind, ...]
    retrieval_mode: RetrievalMode
    chunk_size: int
    shuffle_tools: bool
    history_max_tokens: int | None
    rate_per_s: float
    applied: tuple[str, ...] = ()
    """Kinds of the perturbations applied so far, in order."""

    def after(self, p: Perturbation) -> TrafficState:
        """This state with one perturbation applied."""
        new = self._changed(p)
        return replace(new, applied=(*self.applied, p.kind))

    def _changed(self, p: Perturbation) -> TrafficState:
        match p:
            case ChunkSizeChange():
                return replace(self, chunk_size=p.chunk_size)
            case RetrievalAheadOfHistory():
                return replace(
                    self, retrieval_mode="per_request", layout=_docs_before_history(self.layout)
                )
            case VariableFieldToTop():
                rest = tuple(k for k in self.layout if k != "variable")
                return replace(self, layout=("variable", *rest))
            case ShuffleTools():
                return replace(self, shuffle_tools=True)
            case SlidingWindow():
                return replace(self, history_max_tokens=p.history_max_tokens)
            case RateChange():
                return replace(self, rate_per_s=p.rate_per_s)
            case LayoutChange():
                return replace(self, layout=p.layout)


def _docs_before_history(layout: tuple[SegmentKind, ...]) -> tuple[SegmentKind, ...]:
    """Move (or insert) ``docs`` right before ``history`` (before ``user`` if no history)."""
    if "history" in layout and "docs" in layout and layout.index("docs") < layout.index("history"):
        return layout
    rest: list[SegmentKind] = [k for k in layout if k != "docs"]
    anchor: SegmentKind = "history" if "history" in rest else "user"
    rest.insert(rest.index(anchor), "docs")
    return tuple(rest)


# --- The incident --------------------------------------------------------------------


def incident_workload_spec(rate_per_s: float = 32.0) -> WorkloadSpec:
    """The request stream of the incident, before the change.

    ~32 req/s; 6 tool definitions of 200 tokens + an 800-token system prompt (2,000 shared
    tokens); RAG over 500 topics (Zipf 0.8, 16 docs of ~2,048 tokens each), 512-token
    chunks, top-4 retrieved once per session and placed ahead of the history; user turns
    50–200 tokens, a 24-token variable field at the end, outputs 150–300 tokens; sessions
    of 3.5 turns on average, 256 in flight. Infinite-cache token-weighted hit rate ≈ 0.88.
    """
    return WorkloadSpec(
        rate_per_s=rate_per_s,
        layout=("tools", "system", "docs", "history", "user", "variable"),
        tools=ToolsSpec(count=6, tokens_each=200, shuffle=False),
        system_tokens=800,
        tenants=(TenantSpec(name="default"),),
        retrieval=RetrievalSpec(
            topics=500,
            zipf_exponent=0.8,
            docs_per_topic=16,
            tokens_per_doc=2048,
            chunk_size=512,
            top_k=4,
            mode="per_session",
        ),
        sessions=SessionSpec(mean_turns=3.5, concurrent=256),
        user_tokens=LengthDist(mean_tokens=110, sigma=0.4, min_tokens=50, max_tokens=200),
        variable_tokens=24,
        output_tokens=LengthDist(mean_tokens=220, sigma=0.25, min_tokens=150, max_tokens=300),
        block_size=16,
    )


def incident_perturbations(at_s: float = 3600.0, docs_first: bool = True) -> list[Perturbation]:
    """The incident's change at ``at_s``: chunks 512 → 500 and retrieval re-run every turn
    ahead of the history; with ``docs_first`` the docs also move to the top of the prompt.

    With the docs merely ahead of the history, the 2,000 shared tool + system tokens still
    hit and the infinite-cache hit rate only falls to ≈ 0.50; with the docs first nothing
    but chance repeats of a popular topic's first chunk hits (≈ 0.04–0.08).
    """
    out: list[Perturbation] = [
        ChunkSizeChange(at_s=at_s, chunk_size=500),
        RetrievalAheadOfHistory(at_s=at_s),
    ]
    if docs_first:
        layout: tuple[SegmentKind, ...] = ("docs", "tools", "system", "history", "user", "variable")
        out.append(LayoutChange(at_s=at_s, layout=layout))
    return out
