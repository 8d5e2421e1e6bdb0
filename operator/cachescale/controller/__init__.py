"""The operator: kopf handlers that gather, decide and act on real Kubernetes objects.

``handlers`` registers with kopf; ``evaluation`` runs one policy's gather → decide → act
cycle; ``workload`` reads the Deployment, its pods and its HPA; ``actions`` patches the
HPA and the engine's flags; ``status`` renders what ``kubectl describe`` shows;
``metrics`` exports the operator's own Prometheus series. The decision itself is
``cachescale.decide``, pure and shared with the simulator.
"""
