"""Tests of the pure decision layer (builders in ``decide_builders``)."""
