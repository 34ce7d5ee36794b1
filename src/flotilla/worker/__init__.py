"""The library training workers use to take part in Flotilla's resharding protocol.

    from flotilla.worker import JobClient

    job = JobClient.from_env()          # FLOTILLA_JOB, FLOTILLA_NAMESPACE, FLOTILLA_RANK, ...
    for step in range(start, total):
        compute_s, step_s = train_one_step()      # compute time of this rank; wall time of the step
        job.report_step_time(compute_s, sync_step_time=step_s)   # every rank, every step
        if job.rank == 0:
            job.report_progress(step, steps_per_second)   # rate-limited
            request = job.pending_checkpoint()            # also rate-limited
            if request:
                save_checkpoint(step)                     # e.g. PyTorch DCP, or flotilla.worker.sharded
                job.acknowledge(request, step)
                wait_to_be_replaced()                      # the operator starts the new worker set

The workers of the new set learn their rank and world size from the environment
and restore from the checkpoint, resharding it to the new world size.

Step times feed the straggler detector. `report_step_time(step_time,
sync_step_time=None)` sends one UDP datagram to the Flotilla agent on this node
(FLOTILLA_AGENT_HOST:FLOTILLA_AGENT_PORT, set by the operator) with the job, the
rank, the role (FLOTILLA_ROLE, e.g. "pp1/4", when the TrainingJob says its
parallelism) and the GPU (LOCAL_RANK, when a launcher such as torchrun sets it):

* `step_time`: seconds this rank computed, *without* waiting on collectives
  (e.g. forward+backward measured with CUDA events, before the gradient
  all-reduce). Peers in the same role compare on it: a slow GPU shows here.
* `sync_step_time`: wall seconds of the whole step, optional. Every rank waits
  for the slowest, so it is the same for all ranks and only says the job is slow.

It never raises and never blocks the training loop (a lost datagram is one lost
sample). Without a JobClient, `StepReporter.from_env()` does the same.

PyTorch jobs use `flotilla.worker.torch` (the `flotilla[torch]` extra), which does all of this
with Distributed Checkpoint: see docs/training.md, "Bring your PyTorch job".
"""

from flotilla.worker.client import CheckpointRequest, JobClient, WorkerIdentity
from flotilla.worker.steps import StepReporter

__all__ = ["CheckpointRequest", "JobClient", "StepReporter", "WorkerIdentity"]
