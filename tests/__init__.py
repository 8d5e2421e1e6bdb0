"""The test suite, importable as a package so helpers are imported by name
(``tests.prometheus_fixture``, ``tests.controller.cluster``), never via ``sys.path``."""
