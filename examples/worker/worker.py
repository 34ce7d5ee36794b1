"""An example training worker that takes part in Flotilla's resharding protocol for real.

It trains nothing heavy: its state is a parameter matrix split by rank
(flotilla.worker.sharded), and each step adds 1 to every parameter, so after S
steps every parameter equals S, whatever world sizes the job went through. That
makes a lost or doubled step visible.

Checkpoints go to --checkpoint-dir (shared by all ranks, e.g. a PVC), one
directory per step; `latest` names the last complete one. When Flotilla asks for
a checkpoint (rank 0 sees the request), rank 0 picks a step every rank will reach
and writes it to `stop-at`; each rank writes its shards there and waits; rank 0
completes the checkpoint and acknowledges it. The operator then replaces the
worker set; the new ranks reshard the checkpoint to their world size and go on.

Every rank reports each step's compute time and wall time to the Flotilla agent on
its node (JobClient.report_step_time: UDP to FLOTILLA_AGENT_HOST:FLOTILLA_AGENT_PORT,
with FLOTILLA_ROLE when the TrainingJob says its pipeline stages), which is what the
straggler detector compares.

    python examples/worker/worker.py --checkpoint-dir /ckpt --total-steps 2000 --steps-per-second 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from flotilla.worker import JobClient
from flotilla.worker import sharded

ROWS, WIDTH = 64, 16
# Ranks here have no collectives to keep them in step: none may run more than WINDOW steps ahead of
# rank 0 (which publishes its step), so a stop step WINDOW + 2 ahead of rank 0 is ahead of every rank.
WINDOW = 20


class Job(Protocol):  # what the worker uses of flotilla.worker.JobClient
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def report_progress(self, steps: int, steps_per_second: float, checkpoint_step: int | None = None,
                        force: bool = False) -> bool: ...
    def pending_checkpoint(self, force: bool = False): ...
    def acknowledge(self, request, step: int) -> None: ...
    def report_step_time(self, step_time: float, sync_step_time: float | None = None) -> bool: ...


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _publish(path: Path, value: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(value))
    tmp.replace(path)


def _latest(root: Path) -> Path | None:
    pointer = root / "latest"
    return root / pointer.read_text().strip() if pointer.exists() else None


def _write(root: Path, shards: dict, job: Job, step: int, timeout: float) -> bool:
    """Every rank writes its shards; rank 0 waits for all of them, then publishes the checkpoint."""
    directory = root / f"step-{step:09d}"
    sharded.save(directory, shards, rank=job.rank, world_size=job.world_size, step=step,
                 global_shapes={"params": (ROWS, WIDTH)})
    if job.rank != 0:
        return True
    deadline = time.monotonic() + timeout
    expected = [directory / f"rank-{r}-of-{job.world_size}.npz" for r in range(job.world_size)]
    while not all(p.exists() for p in expected):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    tmp = root / "latest.tmp"
    tmp.write_text(directory.name)
    tmp.replace(root / "latest")
    return True


def train(job: Job, root: Path, total_steps: int, steps_per_second: float, interval: int,
          wait_replaced: float = 3600.0, barrier_timeout: float = 60.0) -> int:
    """Run until the job's steps are done (returns the last step) or this worker set is replaced."""
    root.mkdir(parents=True, exist_ok=True)
    latest = _latest(root)
    if latest is not None:
        step, shards = sharded.load(latest, rank=job.rank, world_size=job.world_size)
    else:
        step, shards = 0, sharded.split({"params": np.zeros((ROWS, WIDTH))}, job.world_size, job.rank)
    last_ckpt = step if latest is not None else None
    started, start_step = time.monotonic(), step
    stop_at_file, lead_file = root / "stop-at", root / "rank0-step"
    pending = None
    while step < total_steps:
        began = time.monotonic()
        if job.rank == 0:
            _publish(lead_file, step)
        else:
            while (lead := _read_int(lead_file)) is not None and step >= lead + WINDOW:
                time.sleep(0.001)  # as a collective would: wait for rank 0
        computing = time.monotonic()
        shards["params"] += 1.0
        step += 1
        if steps_per_second > 0:  # the pace stands for the step's compute
            time.sleep(max(0.0, (step - start_step) / steps_per_second - (time.monotonic() - started)))
        done = time.monotonic()
        # Every rank, every step: its compute time (not the wait for rank 0) and the step's wall time.
        job.report_step_time(done - computing, sync_step_time=done - began)
        stop_at = int(stop_at_file.read_text()) if stop_at_file.exists() else None
        if (interval and step % interval == 0) or step == stop_at:
            if job.rank == 0:
                _publish(lead_file, step)  # let the others reach this step while rank 0 waits for them
            if _write(root, shards, job, step, barrier_timeout) and job.rank == 0:
                last_ckpt = step
        if job.rank == 0:
            rate = (step - start_step) / max(1e-9, time.monotonic() - started)
            job.report_progress(step, rate, last_ckpt)
            if pending is None:
                pending = job.pending_checkpoint()
                if pending is not None:
                    _publish(stop_at_file, step + WINDOW + 2)  # a step every rank has yet to reach
            elif step == stop_at and last_ckpt == step:
                stop_at_file.unlink()
                job.acknowledge(pending, step)
        if step == stop_at:
            time.sleep(wait_replaced)  # the operator replaces this worker set now
            return step
    if job.rank == 0:
        _publish(lead_file, step)
        job.report_progress(step, 0.0, last_ckpt, force=True)
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--total-steps", type=int, required=True)
    parser.add_argument("--steps-per-second", type=float, default=5.0)
    parser.add_argument("--checkpoint-interval", type=int, default=100)
    args = parser.parse_args()
    train(JobClient.from_env(), args.checkpoint_dir, args.total_steps, args.steps_per_second,
          args.checkpoint_interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
