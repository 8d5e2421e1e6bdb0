"""The Kubernetes client stack: a raw-JSON API client, informers, indexes and peering."""
