"""End-to-end tests on a real Kubernetes API server, and their harness (a package so
they import the test suite's helpers as ``tests.…``)."""
