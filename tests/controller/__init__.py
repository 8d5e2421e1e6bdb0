"""Tests of the operator against a fake cluster; its helpers are shared with
the e2e suite and the benchmark (``cluster``, ``process_fixture``, ``engine_fake``)."""
