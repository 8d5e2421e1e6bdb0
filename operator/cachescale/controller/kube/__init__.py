"""The Kubernetes client stack: a raw-JSON API client, informers and their stores, the
indexes evaluations read from, and peering."""
