"""The library training workers use to take part in Flotilla's resharding protocol.

    from flotilla.worker import JobClient

    job = JobClient.from_env()          # FLOTILLA_JOB, FLOTILLA_NAMESPACE, FLOTILLA_RANK, ...
    for step in range(start, total):
        train_one_step()
        if job.rank == 0:
            job.report_progress(step, steps_per_second)   # rate-limited
            request = job.pending_checkpoint()            # also rate-limited
            if request:
                save_checkpoint(step)                     # e.g. PyTorch DCP, or flotilla.worker.sharded
                job.acknowledge(request, step)
                wait_to_be_replaced()                      # the operator starts the new worker set

The workers of the new set learn their rank and world size from the environment
and restore from the checkpoint, resharding it to the new world size.

PyTorch jobs use `flotilla.worker.torch` (the `flotilla[torch]` extra), which does all of this
with Distributed Checkpoint: see docs/training.md, "Bring your PyTorch job".
"""

from flotilla.worker.client import CheckpointRequest, JobClient, WorkerIdentity

__all__ = ["CheckpointRequest", "JobClient", "WorkerIdentity"]
