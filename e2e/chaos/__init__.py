"""The chaos suite: faults and hostile input on the real local control plane.

Each case module exposes `CASES`: case name -> a function `(log_dir: Path) -> Outcome` that starts what it
needs (operator, controller, Redis, agents, workers) against the cluster in KUBECONFIG, injects its fault,
checks the cluster's state, tears its processes down and returns what it counted. The pytest files in e2e/
run every case as a test; `bench/chaos.py` runs them all on a throw-away cluster and prints the figures.
"""
