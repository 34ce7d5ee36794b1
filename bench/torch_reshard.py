"""A real PyTorch job resized through Distributed Checkpoint, on this machine's CPUs (gloo, FSDP2).

1. The resize: examples/torch/train.py on 4 ranks, resized to 2 and then to 3 the way the operator does it
   (a checkpoint request on the job; the old worker set stopped once rank 0 acknowledges; a new set started
   with the new world size), then audited from the ranks' ledgers against an uninterrupted run's sample order:
   steps lost, samples repeated or skipped, the loss jump at each resize, and the checkpoint save time, the
   reshard-load time and the measured restoreSeconds (stop to first step of the new set) the worker reports.
2. Checkpoint cost vs model size: a 4-rank FSDP2 model (and its AdamW state) saved with DCP
   (flotilla.worker.torch), then loaded by 2 ranks (DCP reshards on load); against the baseline a user would
   write without DCP in the same processes: gather the full state to rank 0 and torch.save it, then torch.load
   on rank 0 and broadcast it to the new ranks.

    python bench/torch_reshard.py --quick     # within 5 minutes on 2 CPU cores

The last line is JSON: {"world_sizes": [4, 2, 3], "steps_lost", "samples_repeated", "samples_skipped",
"max_loss_jump", "save_s", "load_s", ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from flotilla.testing.services import free_port  # noqa: E402
from flotilla.testing.torchjob import EXAMPLE, Run, WorkerSet, audit, expected_order, worker_env  # noqa: E402
from flotilla.worker.jobfile import FileJobAPI  # noqa: E402

BATCH, SAMPLES, SEED = 24, 4096, 1
WARMUP = 64  # the width of the model that takes the first save's and load's one-time costs (not reported)


def _wait(check, timeout, workers):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        if any(code not in (None, 0) for code in workers.exited()):
            raise RuntimeError(f"a worker failed: exit codes {workers.exited()} (logs in {workers.log_dir})")
        time.sleep(0.2)
    raise TimeoutError(f"no answer in {timeout}s (logs in {workers.log_dir})")


def resize(work: Path, worlds: list[int], total: int, every: int) -> dict:
    api = FileJobAPI.create(work / "job.json", "bench", "bench", uid="uid-bench")
    argv = [str(EXAMPLE), "--total-steps", str(total), "--global-batch", str(BATCH), "--samples", str(SAMPLES),
            "--seed", str(SEED), "--job-file", str(api.path), "--ledger", str(work / "ledger"),
            # Paced: unpaced, a worker set can finish the job between two of its once-a-second progress
            # reports, before the resize is asked for.
            "--min-step-seconds", "0.25"]

    def start(world, generation):
        port = free_port()
        return WorkerSet([worker_env("bench", "bench", r, world, generation, port, work / "ckpt", "uid-bench", 10)
                          for r in range(world)], argv, work / "logs").start()

    stops: dict[int, int] = {}
    workers = start(worlds[0], 0)
    try:
        for generation, world in enumerate(worlds[1:]):
            target = (generation + 1) * every
            _wait(lambda: (api.progress() or {}).get("steps", 0) >= target, 300, workers)
            api.request_checkpoint(generation + 1, f"resize to {world}")
            ack = _wait(lambda: (a := api.acknowledged()) and a["generation"] == generation + 1 and a, 120, workers)
            stops[generation] = ack["step"]
            workers.stop()
            workers = start(world, generation + 1)
        codes = workers.wait(600)
        if codes != [0] * len(codes):
            raise RuntimeError(f"the last worker set exited with {codes}")
    finally:
        workers.stop()

    run = Run(work / "ledger")
    result = audit(run.trained(stops), expected_order(SAMPLES, BATCH, SEED, total))
    # Steps lost: trained by a worker set past the checkpoint it stopped at (rolled back by the resize).
    lost = sum(max(0, max(g.steps) - stops[g.generation]) for g in run.generations if g.generation in stops)
    loss = run.losses()
    jumps, noise = [], []
    for stop in stops.values():
        before = [loss[s] for s in range(stop - 9, stop + 1)]
        after = [loss[s] for s in range(stop + 1, stop + 4)]
        jumps.append(abs(statistics.mean(after) - statistics.mean(before[-3:])))
        noise.append(statistics.pstdev(before))
    saves = [s["save_s"] for g in run.generations for s in g.saves if s["reason"] == "request"]
    loads = [g.load_s for g in run.generations if g.load_s is not None]
    restores = [g.restore_s for g in run.generations if g.restore_s is not None]
    return {"world_sizes": [g.world for g in run.generations], "acked_steps": list(stops.values()),
            "steps_lost": lost + result["steps_lost"], "steps_repeated": result["steps_repeated"],
            "samples_repeated": result["samples_repeated"], "samples_skipped": result["samples_skipped"],
            "batches_differing": result["batches_differing"],
            "max_loss_jump": round(max(jumps), 4), "loss_noise": round(max(noise), 4),
            "loss_first_last": [round(loss[1], 4), round(loss[total], 4)],
            "save_s": round(statistics.median(saves), 3), "load_s": round(statistics.median(loads), 3),
            "restore_seconds": [round(r, 1) for r in restores]}


# ---- checkpoint cost vs model size: this file is also the worker (--sizes-worker) ----

def sizes_worker(phase: str, widths: list[int], work: Path, out: Path, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    from flotilla.worker.torch import TorchJob

    job = TorchJob.from_env(api=FileJobAPI(work / "job.json"), checkpoint_dir=work / "unused")
    job.init_process_group("gloo")
    for width in [WARMUP, *widths]:  # the first save and load pay one-time costs: a small model takes them
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
        params = sum(p.numel() for p in model.parameters())
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(8, width)).sum().backward()
        optimizer.step()  # the optimizer's state exists, as in any checkpoint taken mid-training
        job.root = work / f"dcp-{width}"
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        baseline_file = work / f"full-{width}.pt"
        dist.barrier()
        dcp_times, base_times = [], []
        for _ in range(repeats):  # the shortest of a few: the run least disturbed by the machine's other work
            if phase == "save":
                started = time.perf_counter()
                job.save(1, model, optimizer)
                dcp_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                msd, osd = get_state_dict(model, optimizer, options=full)
                if job.rank == 0:
                    torch.save({"model": msd, "optim": osd}, baseline_file)
                dist.barrier()
                base_times.append(time.perf_counter() - started)
            else:
                started = time.perf_counter()
                job.restore(model, optimizer)
                dcp_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                state = (torch.load(baseline_file, weights_only=False) if job.rank == 0
                         else {"model": {}, "optim": {}})
                # Separately: with an empty model state dict (ranks but 0) set_state_dict skips the model's broadcast.
                options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
                set_model_state_dict(model, state["model"], options=options)
                set_optimizer_state_dict(model, optimizer, state["optim"], options=options)
                dist.barrier()
                base_times.append(time.perf_counter() - started)
        dcp_s, base_s = min(dcp_times), min(base_times)
        if job.rank == 0 and width != WARMUP:
            with open(out, "a") as f:
                f.write(json.dumps({"phase": phase, "world": job.world_size, "width": width, "params": params,
                                    "state_mb": round(params * 3 * 4 / 2**20, 1), "dcp_s": round(dcp_s, 3),
                                    "torch_save_s": round(base_s, 3)}) + "\n")
    dist.destroy_process_group()


def sizes(work: Path, widths: list[int], repeats: int) -> list[dict]:
    FileJobAPI.create(work / "job.json", "sizes", "bench")
    out = work / "sizes.jsonl"
    for phase, world in (("save", 4), ("load", 2)):
        port = free_port()
        argv = [__file__, "--sizes-worker", phase, "--widths", ",".join(map(str, widths)), "--work", str(work),
                "--repeats", str(repeats)]
        workers = WorkerSet([worker_env("sizes", "bench", r, world, 0, port, work) for r in range(world)], argv,
                            work / "logs").start()
        try:
            codes = workers.wait(600)
        finally:
            workers.stop()
        if codes != [0] * world:
            raise RuntimeError(f"{phase} workers exited with {codes} (logs in {work / 'logs'})")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    table = []
    for width in widths:
        save = next(r for r in rows if r["phase"] == "save" and r["width"] == width)
        load = next(r for r in rows if r["phase"] == "load" and r["width"] == width)
        table.append({"params": save["params"], "state_mb": save["state_mb"],
                      "dcp_save_s": save["dcp_s"], "torch_save_s": save["torch_save_s"],
                      "save_ratio": round(save["dcp_s"] / save["torch_save_s"], 2),
                      "dcp_reshard_load_s": load["dcp_s"], "torch_load_broadcast_s": load["torch_save_s"],
                      "load_ratio": round(load["dcp_s"] / load["torch_save_s"], 2)})
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short run and three model sizes (within 5 minutes)")
    p.add_argument("--sizes-worker", choices=["save", "load"], help=argparse.SUPPRESS)
    p.add_argument("--widths", default="", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sizes_worker:
        sizes_worker(args.sizes_worker, [int(w) for w in args.widths.split(",")], args.work,
                     args.work / "sizes.jsonl", args.repeats)
        return 0
    total, every = (60, 20) if args.quick else (300, 100)
    widths = [256, 1024, 2048] if args.quick else [256, 1024, 2048, 4096]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torch-reshard-") as tmp:
        work = Path(tmp)
        (work / "resize").mkdir()
        (work / "sizes").mkdir()
        result = resize(work / "resize", [4, 2, 3], total, every)
        print(f"resize 4 -> 2 -> 3 over {total} steps: {json.dumps(result)}", flush=True)
        table = sizes(work / "sizes", widths, 2 if args.quick else 3)
    print(f"{'params':>10} {'state MB':>9} {'DCP save':>9} {'torch.save':>11} {'ratio':>6} "
          f"{'DCP load 4->2':>14} {'torch.load+bcast':>17} {'ratio':>6}")
    for r in table:
        print(f"{r['params']:>10} {r['state_mb']:>9} {r['dcp_save_s']:>9} {r['torch_save_s']:>11} "
              f"{r['save_ratio']:>6} {r['dcp_reshard_load_s']:>14} {r['torch_load_broadcast_s']:>17} "
              f"{r['load_ratio']:>6}")
    print(f"elapsed {time.monotonic() - started:.0f}s")
    print(json.dumps({**result, "by_size": table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
