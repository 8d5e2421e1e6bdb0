"""Tests of the emulator: its exposition, its targets and a real Prometheus scraping it."""
