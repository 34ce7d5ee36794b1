"""Translations of other schedulers' queues into Flotilla Queues (pure): `kueue` reads Kueue's ClusterQueues
and Cohorts."""
