"""The reconcile loop: when a policy is evaluated, gather → decide → act, and what it
leaves behind."""
