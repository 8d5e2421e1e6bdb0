"""Tests of the gather layer (fakes, a synthetic dataset, a backfilled TSDB)."""
