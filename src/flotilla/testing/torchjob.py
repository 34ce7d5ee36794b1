"""Run a PyTorch job's worker sets on this machine, and read back what they trained.

`WorkerSet` starts every rank of one worker set as a process, with the environment Flotilla gives a worker
pod (rendezvous on 127.0.0.1); `Run` reads the ledgers examples/torch/train.py writes (--ledger) and says
what the job trained: the steps, the samples and the loss of each, the checkpoints saved and restored. Used by
tests/worker_torch, bench/torch_reshard.py and e2e/test_torch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train.py"


def worker_env(job: str, namespace: str, rank: int, world: int, generation: int, port: int,
               checkpoint_dir: Path | str, uid: str = "", interval_steps: int = 0) -> dict[str, str]:
    """What the operator puts in a worker pod's environment, with rank 0 on this machine."""
    env = {"FLOTILLA_JOB": job, "FLOTILLA_NAMESPACE": namespace, "FLOTILLA_JOB_UID": uid,
           "FLOTILLA_RANK": str(rank), "FLOTILLA_WORLD_SIZE": str(world), "FLOTILLA_GENERATION": str(generation),
           "FLOTILLA_RENDEZVOUS_ADDR": "127.0.0.1", "FLOTILLA_RENDEZVOUS_PORT": str(port),
           "FLOTILLA_CHECKPOINT_DIR": str(checkpoint_dir)}
    if interval_steps:
        env["FLOTILLA_CHECKPOINT_INTERVAL_STEPS"] = str(interval_steps)
    return env


def process_env(pod_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker process runs with here: this machine's, the pod's, this checkout's code, one
    thread each (the ranks share the machine's cores, as they would not share a GPU)."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **pod_env}


@dataclass
class WorkerSet:
    """Every rank of one worker set, as local processes running `argv` (python examples/torch/train.py ...)."""

    envs: list[dict[str, str]]
    argv: list[str]
    log_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> "WorkerSet":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for env in self.envs:
            name = f"g{env['FLOTILLA_GENERATION']}-r{env['FLOTILLA_RANK']}.log"
            with open(self.log_dir / name, "ab") as out:
                self.procs.append(subprocess.Popen([sys.executable, *self.argv], env=process_env(env), stdout=out,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        return self

    def exited(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def stop(self) -> None:
        """As the operator deleting the pods does: SIGTERM, then SIGKILL what is left."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def wait(self, timeout: float) -> list[int]:
        return [p.wait(timeout) for p in self.procs]


@dataclass
class Generation:
    generation: int
    world: int
    steps: dict[int, list[int]]  # step -> the samples trained (every rank's, in rank order)
    loss: dict[int, float]  # step -> global batch loss
    saves: list[dict]  # {"step", "save_s", "reason", "position"} (rank 0's)
    restored_step: int | None = None
    load_s: float | None = None
    restore_s: float | None = None
    ranks: list[int] = field(default_factory=list)


class Run:
    """The ledgers of one job, every worker set."""

    def __init__(self, ledger_dir: Path):
        lines: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for path in sorted(Path(ledger_dir).glob("g*-r*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    lines[(entry["generation"], entry["rank"])].append(entry)
        self.generations: list[Generation] = []
        for g in sorted({g for g, _ in lines}):
            ranks = sorted(r for gg, r in lines if gg == g)
            world = lines[(g, ranks[0])][0]["world"]
            steps: dict[int, list[int]] = defaultdict(list)
            loss: dict[int, float] = {}
            gen = Generation(g, world, steps, loss, [])
            for r in ranks:
                for e in lines[(g, r)]:
                    event = e.get("event")
                    if event is None:
                        steps[e["step"]].extend(e["ids"])
                        loss[e["step"]] = e["loss"]
                    elif event == "save" and r == 0:
                        gen.saves.append(e)
                    elif event == "restore" and r == 0:
                        gen.restored_step, gen.load_s = e["step"], e["load_s"]
                    elif event == "restored":
                        gen.restore_s = e["restore_s"]
            gen.steps, gen.ranks = dict(steps), ranks
            self.generations.append(gen)

    def trained(self, stops: Mapping[int, int]) -> list[tuple[int, list[int]]]:
        """(step, samples) in the order the job's final state saw them: each worker set's steps up to where it
        stopped (`stops`: generation -> acknowledged step; a set's steps past it were rolled back)."""
        out: list[tuple[int, list[int]]] = []
        for gen in self.generations:
            last = stops.get(gen.generation)
            out.extend((s, gen.steps[s]) for s in sorted(gen.steps) if last is None or s <= last)
        return out

    def losses(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for gen in self.generations:
            out.update(gen.loss)
        return out


def expected_order(num_samples: int, global_batch: int, seed: int, steps: int) -> list[list[int]]:
    """The global batches of an uninterrupted run (flotilla.worker.torch.SampleOrder from the start)."""
    from flotilla.worker.torch import SampleOrder

    order = SampleOrder(num_samples, global_batch, seed)
    return [order.next_batch(0, 1) for _ in range(steps)]


def audit(trained: Iterable[tuple[int, list[int]]], expected: list[list[int]]) -> dict[str, int]:
    """Compare what was trained with an uninterrupted run: steps lost or repeated, samples repeated or skipped."""
    trained = list(trained)
    seen_steps = [s for s, _ in trained]
    repeated_steps = len(seen_steps) - len(set(seen_steps))
    lost_steps = len(set(range(1, len(expected) + 1)) - set(seen_steps))
    got: defaultdict[int, int] = defaultdict(int)
    for _, ids in trained:
        for i in ids:
            got[i] += 1
    want: defaultdict[int, int] = defaultdict(int)
    for ids in expected:
        for i in ids:
            want[i] += 1
    repeated = sum(max(0, got[i] - want[i]) for i in got)
    skipped = sum(max(0, want[i] - got[i]) for i in want)
    out_of_order = sum(1 for s, ids in trained if 1 <= s <= len(expected) and sorted(ids) != sorted(expected[s - 1]))
    return {"steps_lost": lost_steps, "steps_repeated": repeated_steps, "samples_repeated": repeated,
            "samples_skipped": skipped, "batches_differing": out_of_order}
