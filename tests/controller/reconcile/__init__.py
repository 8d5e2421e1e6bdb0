"""Tests of ``cachescale.controller.reconcile``: scheduling, evaluation, status, events, metrics."""
