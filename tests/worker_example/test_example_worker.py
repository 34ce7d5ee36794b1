"""The example worker (examples/worker/worker.py) checkpoints on request and resumes at another world size."""

import sys
import threading
import time
from pathlib import Path

import numpy as np

from flotilla.worker import CheckpointRequest, sharded

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "worker"))
import worker as example  # noqa: E402


class Job:
    """Stands in for JobClient: the TrainingJob's annotations are a shared dict."""

    def __init__(self, shared: dict, rank: int, world: int):
        self.shared, self.rank, self.world_size = shared, rank, world

    def report_progress(self, steps, steps_per_second, checkpoint_step=None, force=False):
        self.shared["progress"] = (steps, checkpoint_step)
        return True

    def pending_checkpoint(self, force=False):
        req = self.shared.get("request")
        return req if req and req.generation > self.shared.get("acked", 0) else None

    def acknowledge(self, request, step):
        self.shared["acked"], self.shared["ack_step"] = request.generation, step

    def report_step_time(self, step_time, sync_step_time=None):
        self.shared.setdefault("step_times", {}).setdefault(self.rank, []).append((step_time, sync_step_time))
        return True


def run_world(shared, root, world, total, **kw):
    results = [None] * world

    def one(rank):
        results[rank] = example.train(Job(shared, rank, world), root, total, 400.0, 25, wait_replaced=0.0, **kw)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    return threads, results


def test_checkpoint_on_request_then_resume_at_another_world_size(tmp_path):
    shared = {}
    threads, results = run_world(shared, tmp_path, 3, 100_000)
    while shared.get("progress", (0, None))[0] < 60:
        time.sleep(0.01)
    shared["request"] = CheckpointRequest(1, "shrink", False)
    for t in threads:
        t.join(timeout=30)
    step = shared["ack_step"]
    assert shared["acked"] == 1 and results == [step] * 3  # every rank stopped at the agreed step
    assert (tmp_path / "latest").read_text().strip() == f"step-{step:09d}"
    latest = tmp_path / (tmp_path / "latest").read_text().strip()
    assert sharded.read_manifest(latest).step == step
    whole = np.concatenate([sharded.load(latest, rank=r, world_size=1)[1]["params"] for r in range(1)])
    assert whole.shape == (example.ROWS, example.WIDTH) and np.all(whole == step)

    # Every rank reported every step it ran: compute time within the step's wall time.
    reported = shared.pop("step_times")
    assert sorted(reported) == [0, 1, 2] and all(len(times) >= step for times in reported.values())
    assert all(0 <= compute <= wall for times in reported.values() for compute, wall in times)

    # The new worker set has 2 ranks: each reshards the checkpoint and runs to the end.
    total = step + 40
    threads, results = run_world(shared, tmp_path, 2, total)
    for t in threads:
        t.join(timeout=30)
    assert results == [total, total]
    assert shared["progress"][0] == total
    final = tmp_path / (tmp_path / "latest").read_text().strip()
    for world in (1, 2, 5):
        parts = [sharded.load(final, rank=r, world_size=world)[1]["params"] for r in range(world)]
        assert np.all(np.concatenate(parts) == sharded.read_manifest(final).step)
