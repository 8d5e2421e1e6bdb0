"""Tests of ``cachescale.controller.target``: the workload, its HPA or ScaledObject, the actions."""
