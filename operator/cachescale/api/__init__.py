"""The API layer: CacheScalingPolicy as pydantic v2 models, and the CRD generated from them.

Pure types and validation — no I/O. The operator, the CLI and the CRD in ``crds/`` all
derive from these models, so the wire format is defined in exactly one place.
"""
