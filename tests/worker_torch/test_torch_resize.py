"""examples/torch/train.py for real, on CPU (gloo, FSDP2): 4 ranks, resized to 2 and then to 3 through the
checkpoint protocol, driven by what the operator does (a checkpoint request annotation on the job, the old
worker set stopped once rank 0 acknowledges, a new one started with the new world size)."""

from __future__ import annotations

import shutil
import statistics
import time

import pytest

torch = pytest.importorskip("torch")

from flotilla.testing.services import free_port  # noqa: E402
from flotilla.testing.torchjob import EXAMPLE, Run, WorkerSet, audit, expected_order, worker_env  # noqa: E402
from flotilla.worker.jobfile import FileJobAPI  # noqa: E402

TOTAL, BATCH, SAMPLES, SEED, INTERVAL = 60, 24, 4096, 0, 10


def _wait(what, check, timeout, workers=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if workers is not None and any(code not in (None, 0) for code in workers.exited()):
            pytest.fail(f"a worker failed while waiting for {what}: exit codes {workers.exited()}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def test_a_job_resized_4_to_2_to_3_trains_every_sample_once_and_keeps_its_loss_and_parameters(tmp_path):
    api = FileJobAPI.create(tmp_path / "job.json", "resize", "ns", uid="uid-resize")
    ckpt, ledger = tmp_path / "ckpt", tmp_path / "ledger"
    argv = [str(EXAMPLE), "--total-steps", str(TOTAL), "--global-batch", str(BATCH), "--samples", str(SAMPLES),
            "--seed", str(SEED), "--job-file", str(api.path), "--ledger", str(ledger),
            "--dump-restored", str(tmp_path),
            # Paced: unpaced, a worker set can finish the job between two of its once-a-second progress
            # reports, before the resize is asked for.
            "--min-step-seconds", "0.25"]

    def start(world, generation):
        port = free_port()
        envs = [worker_env("resize", "ns", r, world, generation, port, ckpt, "uid-resize", INTERVAL)
                for r in range(world)]
        return WorkerSet(envs, argv, tmp_path / "logs").start()

    def progress():
        return (api.progress() or {}).get("steps", 0)

    stops, acked_seen = {}, []
    workers = start(4, 0)
    saved_at_first_stop = None
    try:
        for generation, world, run_until in ((0, 4, 15), (1, 2, 35)):
            _wait(f"step {run_until} on {world} ranks", lambda: progress() >= run_until, 240, workers)
            before = progress()
            api.request_checkpoint(generation + 1, f"resize to {(2, 3)[generation]} GPUs")
            ack = _wait(f"checkpoint generation {generation + 1}",
                        lambda: (a := api.acknowledged()) and a["generation"] == generation + 1 and a, 120, workers)
            assert ack["step"] >= before, "the checkpoint is taken at or after the step reported when asked"
            stops[generation] = ack["step"]
            acked_seen.append(ack["step"])
            if generation == 0:
                saved_at_first_stop = tmp_path / "saved-at-first-stop"
                shutil.copytree(ckpt / (ckpt / "latest").read_text().strip(), saved_at_first_stop)
            workers.stop()
            workers = start((2, 3)[generation], generation + 1)
        assert workers.wait(240) == [0, 0, 0]
    finally:
        workers.stop()

    run = Run(ledger)
    assert [(g.generation, g.world) for g in run.generations] == [(0, 4), (1, 2), (2, 3)]
    # The step counter never goes back past the acknowledged checkpoint: each new set starts right after it.
    assert [g.restored_step for g in run.generations] == [None, *acked_seen]
    for gen, stop in zip(run.generations, (*acked_seen, TOTAL)):
        assert max(gen.steps) == stop, f"generation {gen.generation} trained past its checkpoint"
    assert progress() == TOTAL

    # No sample trained twice or skipped, checked against an uninterrupted run's order and the loader state.
    result = audit(run.trained(stops), expected_order(SAMPLES, BATCH, SEED, TOTAL))
    assert result == {"steps_lost": 0, "steps_repeated": 0, "samples_repeated": 0, "samples_skipped": 0,
                      "batches_differing": 0}
    for gen in run.generations:
        for save in gen.saves:
            assert save["position"] == [save["step"] * BATCH // SAMPLES, save["step"] * BATCH % SAMPLES]
    assert [s["reason"] for s in run.generations[0].saves][-1] == "request"

    # The loss curve goes on: the first steps after a resize are within noise of the steps before it.
    loss = run.losses()
    for stop in acked_seen:
        before = [loss[s] for s in range(stop - 9, stop + 1)]
        after = [loss[s] for s in range(stop + 1, stop + 4)]
        noise = statistics.pstdev(before)
        assert abs(statistics.mean(after) - statistics.mean(before[-3:])) <= 3 * noise, (stop, before, after)
    assert statistics.mean(loss[s] for s in range(TOTAL - 9, TOTAL + 1)) < statistics.mean(
        loss[s] for s in range(1, 11)), "it learns"

    # Parameters after the 4 -> 2 reshard equal those saved: the checkpoint read back without any process group.
    import torch.distributed.checkpoint as dcp

    restored = torch.load(tmp_path / "restored-g1.pt")
    assert restored["step"] == acked_seen[0]
    saved = {"training": {"model": {k: torch.empty_like(v) for k, v in restored["params"].items()}}}
    dcp.load(saved, checkpoint_id=saved_at_first_stop)
    assert saved["training"]["model"].keys() == restored["params"].keys()
    for name, value in restored["params"].items():
        assert torch.equal(value, saved["training"]["model"][name]), name

    # What the restores cost is measured and reported (rank 0 of each resized set).
    assert all(g.restore_s is not None and g.restore_s > 0 for g in run.generations[1:])
