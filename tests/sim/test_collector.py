"""The cyclic garbage collector is off while a simulation runs and as before after it."""

from __future__ import annotations

import gc

import pytest

from cachescale.sim.collector import paused_collection


def test_collection_is_off_inside_and_back_on_after() -> None:
    assert gc.isenabled()
    with paused_collection():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collection_comes_back_after_an_error() -> None:
    with pytest.raises(RuntimeError), paused_collection():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_nested_pause_leaves_collection_off_for_the_outer_block() -> None:
    with paused_collection():
        with paused_collection():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_already_off_stays_off() -> None:
    gc.disable()
    try:
        with paused_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
