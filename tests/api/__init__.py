"""Tests of the API models, the CRD and its CEL rules (helper: ``crd_emulation``)."""
