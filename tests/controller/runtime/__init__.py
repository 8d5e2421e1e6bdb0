"""Tests of ``cachescale.controller.runtime``: kopf's patched start-up, its storage, the fence."""
