"""Check 2, emulator parity: the emulator's ``vllm:`` families against a live real vLLM's.

``tests/emulator/test_vllm_parity.py`` compares the emulator with a recorded exposition of
vLLM 0.32.0; this module makes the same comparison (``tests.emulator.vllm_parity``)
against the server the referee suite runs, after a few completions, so a vLLM upgrade
that adds, drops or reshapes a family fails here until the emulator serves it alike or
``NOT_EXPOSED`` and docs/emulator.md list it with why.
"""

from __future__ import annotations

from cachescale.sim.vllm_metrics import NOT_EXPOSED
from referee.vllm import VllmServer
from tests.emulator.vllm_parity import (
    FIXTURE_MAX_MODEL_LEN,
    differences,
    emulated_exposition,
    shapes,
)


def test_every_live_vllm_family_is_served_alike_or_listed(vllm_server: VllmServer) -> None:
    assert vllm_server.settings.max_model_len == FIXTURE_MAX_MODEL_LEN  # the token buckets
    prefix = list(range(10, 74))
    for suffix in range(3):
        vllm_server.complete([*prefix, 300 + suffix], max_tokens=2)
    real = shapes(vllm_server.metrics())
    assert "vllm:request_success" in real
    assert differences(real, shapes(emulated_exposition()), NOT_EXPOSED) == []
