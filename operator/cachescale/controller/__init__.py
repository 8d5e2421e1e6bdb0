"""The operator: kopf handlers that gather, decide and act on real Kubernetes objects.

Four packages, each one concern: ``kube`` talks to the API server (the client, the
informers and their stores, the indexes evaluations read from, peering); ``reconcile``
is the loop (when each policy is due, one policy's gather → decide → act, the status,
Events and metrics it leaves); ``target`` is what a policy manages (the Deployment, its
pods, its HPA or KEDA ScaledObject, the engine's flags, the patches, change correlation);
``runtime`` is the kopf side (the handlers, the policies served, the running process,
kopf's patched start-up and storage). The decision itself is ``cachescale.decide``, pure
and shared with the simulator.
"""
