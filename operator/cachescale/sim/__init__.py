"""The simulator: a vLLM-faithful prefix-cache fleet under an autoscaler.

Pure Python (numpy allowed, prometheus_client for the engine's series); no Kubernetes,
no Prometheus server, no clock. It is the project's test bed for every decision.
"""
