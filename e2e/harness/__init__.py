"""The e2e suite's own control plane: envtest binaries started per test session, and a
node stand-in that makes the pods of real Deployments Running and Ready (no kubelet)."""
