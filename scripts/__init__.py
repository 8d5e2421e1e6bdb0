"""Developer scripts, run from the repository root; the Python ones are importable by the
tests (``from scripts.import_cycles import import_cycles``)."""
