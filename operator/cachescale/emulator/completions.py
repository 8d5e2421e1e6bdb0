"""A minimal OpenAI-compatible ``POST /v1/completions`` on every emulated pod.

It exists so a client can put a request through a simulated engine's prefix cache and
watch that engine's ``/metrics`` move, as it would against vLLM: ``cachescale audit run
--endpoint`` does exactly that (``docs/audit.md``, "Live mode"). The emulator has no
vocabulary and no sampler, so it takes what needs neither:

- ``prompt``: the token ids, a non-empty list of integers in ``[0, 2**31)`` (vLLM accepts
  token-id prompts; text is refused: there is no tokenizer);
- ``max_tokens``: 1, or absent (one output token is all the engine generates);
- ``temperature``, ``model``, ``stream: false``, ``cache_salt`` (vLLM's per-request salt,
  mixed into block 0 as the simulator's hashing does); other fields are ignored.

The request goes to the pod's engine at the simulation's current time (``runtime``:
:meth:`Emulator.complete`) and the answer waits until the simulation has finished it, so
it takes the engine's simulated prefill time (divided by ``--speed``). The reply is a
completions object with one choice: an empty ``text``, its one token id ``0`` in
``token_ids``, ``finish_reason: "length"``, and ``usage`` with the prompt's cached tokens
in ``prompt_tokens_details`` (as vLLM with ``--enable-prompt-tokens-details``). A bad
body is a 400 with an OpenAI-style ``{"error": {...}}`` object.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import numpy as np

from cachescale.sim.request import SimRequest

MAX_TOKEN_ID = 2**31 - 1
#: Largest request body read, bytes (a 128k-token prompt of 10-digit ids fits).
MAX_BODY_BYTES = 8 * 1024 * 1024

_REASONS = {
    400: "400 Bad Request",
    405: "405 Method Not Allowed",
    413: "413 Content Too Large",
    503: "503 Service Unavailable",
    504: "504 Gateway Timeout",
}


Complete = Callable[[bytes, str], SimRequest]
"""Serve a prompt (int32 token ids) with a salt on one pod's engine; the finished request."""


class CompletionError(Exception):
    """A completion the emulator cannot serve; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _BadRequestError(Exception):
    """The body is not a completion request the emulator can serve."""


def _json(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


def _error(start_response: StartResponse, code: int, message: str) -> list[bytes]:
    kind = "invalid_request_error" if code == 400 else "server_error"
    return _json(
        start_response,
        _REASONS.get(code, f"{code} Error"),
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
    )


def parse_request(body: bytes) -> tuple[list[int], str]:
    """The prompt's token ids and the salt of a request body; ``_BadRequestError`` saying what
    is wrong otherwise."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _BadRequestError("the body is not JSON") from None
    if not isinstance(data, dict):
        raise _BadRequestError("the body must be a JSON object")
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        raise _BadRequestError("'prompt' must be token ids: the emulator has no tokenizer")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in prompt)
    ):
        raise _BadRequestError(
            f"'prompt' must be a non-empty list of token ids in [0, {MAX_TOKEN_ID}]"
        )
    max_tokens = data.get("max_tokens", 1)
    if type(max_tokens) is not int or max_tokens != 1:
        raise _BadRequestError("'max_tokens' must be 1: the emulator generates one token")
    temperature = data.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise _BadRequestError("'temperature' must be a number")
    if data.get("stream", False) is not False:
        raise _BadRequestError("'stream' is not supported by the emulator")
    salt = data.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise _BadRequestError("'cache_salt' must be a non-empty string")
    return prompt, salt or ""


def _read_body(environ: WSGIEnvironment) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _BadRequestError("a bad Content-Length") from None
    if length > MAX_BODY_BYTES:
        raise CompletionError(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
    body: bytes = environ["wsgi.input"].read(length)
    return body


def completions_app(complete: Complete, model_name: str) -> WSGIApplication:
    """The ``/v1/completions`` handler of one pod, serving through ``complete``."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            return _error(start_response, 405, "/v1/completions takes POST")
        try:
            prompt, salt = parse_request(_read_body(environ))
            tokens = np.asarray(prompt, dtype=np.int32).tobytes()
            request = complete(tokens, salt)
        except _BadRequestError as error:
            return _error(start_response, 400, str(error))
        except CompletionError as error:
            return _error(start_response, error.status, str(error))
        cached = request.cached_tokens or 0
        return _json(
            start_response,
            "200 OK",
            {
                "id": f"cmpl-emulated{-request.request_id}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": [0],
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": request.prompt_tokens,
                    "completion_tokens": 1,
                    "total_tokens": request.prompt_tokens + 1,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            },
        )

    return serve
