"""The kopf side of the operator: handlers, the running process, kopf's patched start-up
and bookkeeping."""
