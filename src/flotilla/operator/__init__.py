"""The operator: observe (watched objects) -> decide (pure allocator/planner) -> apply (Kubernetes).

`actions` and `training`/`serving` are pure (dicts in, actions out); `kube`
applies actions; `handlers` wires kopf watches to one reconcile loop.
"""
