"""PyTorch workers under Flotilla (the `flotilla[torch]` extra): what a DDP or FSDP2 training loop needs.

    from flotilla.worker.torch import SampleOrder, TorchJob

    job = TorchJob.from_env()                  # rank, world size, generation, rendezvous, checkpoint dir
    job.init_process_group()                   # gloo on CPU, nccl on GPUs, rank 0 of this worker set
    model = fully_shard(Net())                 # or DistributedDataParallel(Net())
    optimizer = torch.optim.AdamW(model.parameters())
    data = SampleOrder(len(dataset), global_batch=64, seed=0)
    step = job.restore(model, optimizer, data)         # the latest checkpoint, resharded to this world size
    while step < total_steps:
        started = time.perf_counter()
        batch = [dataset[i] for i in data.next_batch(job.rank, job.world_size)]
        ...                                    # forward, backward, optimizer.step()
        step += 1
        if job.step_done(step, model, optimizer, data, compute_seconds=time.perf_counter() - started):
            break                              # checkpointed for a resize: this worker set is replaced
    job.finish(step)

Checkpoints are torch.distributed.checkpoint (DCP) directories `<dir>/step-<n>/` holding the model, the
optimizer, the data order's position and the RNG state; `<dir>/latest` names the last complete one. DCP
loads one saved at any world size into another. A checkpoint is taken every
`FLOTILLA_CHECKPOINT_INTERVAL_STEPS` steps and when the operator asks for one (the resharding protocol):
then every rank saves at the same step, rank 0 acknowledges it, and the worker set waits to be replaced.
Under `torchrun` (several processes per pod), `python -m flotilla.worker.torch train.py ...` starts it with
the rendezvous Flotilla gives the pod, and TorchJob takes the ranks torchrun sets.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from flotilla.worker.client import JobClient, WorkerIdentity

log = logging.getLogger(__name__)

LATEST = "latest"
META = "flotilla.json"


@dataclass(frozen=True)
class Rendezvous:
    """How the processes of one worker set find each other."""

    rank: int  # global rank of this process
    world_size: int  # processes in the worker set
    local_rank: int  # within the pod (torchrun's LOCAL_RANK), 0 without torchrun
    address: str  # rank 0's host
    port: int
    torchrun: bool  # started by torchrun: it set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Rendezvous":
        env = dict(os.environ if env is None else env)
        if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "LOCAL_RANK" in env):
            return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                       env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)), True)
        missing = [k for k in ("FLOTILLA_RANK", "FLOTILLA_WORLD_SIZE", "FLOTILLA_RENDEZVOUS_ADDR") if k not in env]
        if missing:
            raise RuntimeError(f"no rendezvous for the process group: {', '.join(missing)} not set "
                               "(Flotilla sets them in every worker pod)")
        return cls(int(env["FLOTILLA_RANK"]), int(env["FLOTILLA_WORLD_SIZE"]), 0, env["FLOTILLA_RENDEZVOUS_ADDR"],
                   int(env.get("FLOTILLA_RENDEZVOUS_PORT", 29500)), False)

    def init_method(self) -> str:
        return "env://" if self.torchrun else f"tcp://{self.address}:{self.port}"


def torchrun_args(env: Mapping[str, str] | None = None) -> list[str]:
    """torchrun's arguments for this pod: one node per pod, FLOTILLA_GPUS_PER_WORKER processes on it."""
    env = dict(os.environ if env is None else env)
    return ["--nnodes", env["FLOTILLA_WORLD_SIZE"], "--node-rank", env["FLOTILLA_RANK"],
            "--nproc-per-node", env.get("FLOTILLA_GPUS_PER_WORKER", "1"),
            "--master-addr", env["FLOTILLA_RENDEZVOUS_ADDR"], "--master-port", env.get("FLOTILLA_RENDEZVOUS_PORT",
                                                                                        "29500")]


class SampleOrder(Stateful):
    """The order samples are trained in, resumable at any world size: a permutation of `num_samples` per
    epoch (from `seed` and the epoch), consumed `global_batch` samples a step whatever the world size. Each
    rank trains its contiguous share of the step's global batch; the position is saved in every checkpoint,
    so a resumed job trains exactly the samples it had not, in the same order."""

    def __init__(self, num_samples: int, global_batch: int, seed: int = 0):
        if num_samples <= 0 or global_batch <= 0:
            raise ValueError(f"num_samples ({num_samples}) and global_batch ({global_batch}) must be positive")
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.epoch, self.position = 0, 0

    def _permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def global_batch_ids(self) -> list[tuple[int, int]]:
        """(epoch, sample) of the next step's global batch, without consuming it."""
        out: list[tuple[int, int]] = []
        epoch, position = self.epoch, self.position
        while len(out) < self.global_batch:
            take = min(self.global_batch - len(out), self.num_samples - position)
            out.extend((epoch, int(i)) for i in self._permutation(epoch)[position:position + take])
            position += take
            if position == self.num_samples:
                epoch, position = epoch + 1, 0
        return out

    def next_batch(self, rank: int, world_size: int) -> list[int]:
        """This rank's sample indices for the next step; the order moves on by one global batch."""
        ids = self.global_batch_ids()
        base, extra = divmod(len(ids), world_size)
        start = rank * base + min(rank, extra)
        mine = [i for _, i in ids[start:start + base + (rank < extra)]]
        self.position += self.global_batch
        self.epoch += self.position // self.num_samples
        self.position %= self.num_samples
        return mine

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": torch.tensor(self.epoch), "position": torch.tensor(self.position),
                "num_samples": torch.tensor(self.num_samples), "global_batch": torch.tensor(self.global_batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples or int(state["global_batch"]) != self.global_batch:
            raise ValueError(f"checkpoint's data order has {int(state['num_samples'])} samples in batches of "
                             f"{int(state['global_batch'])}, this job {self.num_samples} in {self.global_batch}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class _Training(Stateful):
    """Model and optimizer through DCP's state-dict helpers: DDP, FSDP2 or a plain module alike."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_state_dict(self.model, [])[0]}
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer or [], model_state_dict=state["model"],
                       optim_state_dict=state.get("optim", {}))


class _Rng(Stateful):
    """The CPU generator's state (saved once, as DCP saves what is replicated; every rank gets it back)."""

    def state_dict(self) -> dict[str, Any]:
        return {"cpu": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])


def pipeline_role(where: Any, dim: str = "pp") -> str:
    """This rank's pipeline stage as the health detectors read roles: "pp<stage>/<stages>".

    `where` is a DeviceMesh with a `dim` dimension (the stage is this rank's coordinate on it), or the process
    group of this rank's pipeline (one rank per stage, in stage order, as torch.distributed.pipelining's
    schedules take it). Ranks of one stage do the same work, so the detectors compare them with each other."""
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(where, DeviceMesh):
        names = tuple(where.mesh_dim_names or ())
        if dim not in names:
            raise ValueError(f"the device mesh has no {dim!r} dimension (its dimensions: {list(names)})")
        stage, stages = where.get_local_rank(dim), where.size(names.index(dim))
    else:
        stage, stages = dist.get_rank(where), dist.get_world_size(where)
        if stage < 0:
            raise ValueError("this rank is not a member of the pipeline's process group")
    return f"pp{stage}/{stages}"


class TorchJob:
    def __init__(self, client: JobClient, rendezvous: Rendezvous, checkpoint_dir: str | Path,
                 interval_steps: int = 0, keep: int = 2, wait_replaced: float = 3600.0):
        self.client, self.rendezvous = client, rendezvous
        self.root = Path(checkpoint_dir)
        self.interval_steps, self.keep, self.wait_replaced = interval_steps, keep, wait_replaced
        self.last_checkpoint: int | None = None
        self.stopped_for: int | None = None  # the checkpoint request this worker set stopped for
        self.save_seconds: float | None = None  # the last save, wall time on this rank
        self.load_seconds: float | None = None  # the restore's DCP load
        self.restore_seconds: float | None = None  # acknowledged checkpoint -> first step of this set (rank 0)
        self._restored_meta: dict[str, Any] | None = None
        self._started, self._start_step = time.monotonic(), 0

    @classmethod
    def from_env(cls, api: Any = None, env: Mapping[str, str] | None = None, **kwargs: Any) -> "TorchJob":
        env = dict(os.environ if env is None else env)
        rdzv = Rendezvous.from_env(env)
        base = WorkerIdentity.from_env(env)
        identity = WorkerIdentity(base.job, base.namespace, rdzv.rank, rdzv.world_size, base.generation, base.job_uid)
        directory = kwargs.pop("checkpoint_dir", None) or env.get("FLOTILLA_CHECKPOINT_DIR")
        if not directory:
            raise RuntimeError("no checkpoint directory: set spec.checkpoint.uri to file:///dir or pvc://claim/dir "
                               "(the operator sets FLOTILLA_CHECKPOINT_DIR), or pass checkpoint_dir")
        kwargs.setdefault("interval_steps", int(env.get("FLOTILLA_CHECKPOINT_INTERVAL_STEPS", 0)))
        return cls(JobClient(identity, api=api), rdzv, directory, **kwargs)

    @property
    def rank(self) -> int:
        return self.rendezvous.rank

    @property
    def world_size(self) -> int:
        return self.rendezvous.world_size

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.rendezvous.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def init_process_group(self, backend: str | None = None, timeout: float = 600.0) -> None:
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(self.rendezvous.local_rank)
        dist.init_process_group(backend, init_method=self.rendezvous.init_method(), rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=timeout))
        log.info("rank %d/%d: process group up (%s, %s)", self.rank, self.world_size, backend,
                 self.rendezvous.init_method())

    def report_pipeline(self, where: Any, dim: str = "pp") -> str:
        """Say this rank's pipeline stage (from its DeviceMesh or its pipeline's process group, see
        `pipeline_role`) with its step times, so that the detectors compare it with the ranks of its own stage
        even where the TrainingJob declares no `parallelism`. Returns the role."""
        role = pipeline_role(where, dim)
        self.client.report_role(role)
        return role

    def _state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
               data: SampleOrder | None) -> dict[str, Any]:
        state: dict[str, Any] = {"training": _Training(model, optimizer), "rng": _Rng()}
        if data is not None:
            state["data"] = data
        return state

    def latest(self) -> Path | None:
        pointer = self.root / LATEST
        return self.root / pointer.read_text().strip() if pointer.exists() else None

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                data: SampleOrder | None = None) -> int:
        """Load the latest complete checkpoint, whatever world size wrote it; the step to go on from (0: none)."""
        found = [str(self.latest() or "")]
        dist.broadcast_object_list(found, src=0)  # every rank loads the one rank 0 saw
        step = 0
        if found[0]:
            directory = Path(found[0])
            meta = json.loads((directory / META).read_text())
            started = time.perf_counter()
            dcp.load(self._state(model, optimizer, data), checkpoint_id=directory)
            self.load_seconds = time.perf_counter() - started
            step = int(meta["step"])
            self.last_checkpoint = step
            self._restored_meta = meta
            log.info("rank %d/%d: restored step %d from %s (saved by %d ranks) in %.2fs", self.rank, self.world_size,
                     step, directory, meta["worldSize"], self.load_seconds)
        self._started, self._start_step = time.monotonic(), step
        return step

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             data: SampleOrder | None = None, reason: str = "periodic") -> Path:
        """Every rank calls it at the same step; complete (named by `latest`) once this returns on rank 0."""
        directory = self.root / f"step-{step:09d}"
        started = time.perf_counter()
        dcp.save(self._state(model, optimizer, data), checkpoint_id=directory)
        if self.rank == 0:
            meta = {"step": step, "worldSize": self.world_size, "generation": self.client.identity.generation,
                    "reason": reason, "savedAt": time.time()}
            _write_atomic(directory / META, json.dumps(meta))
            _write_atomic(self.root / LATEST, directory.name)
            self._prune(directory.name)
        dist.barrier()  # no rank goes on (or acknowledges) before `latest` names the new checkpoint
        self.save_seconds = time.perf_counter() - started
        self.last_checkpoint = step
        return directory

    def _prune(self, newest: str) -> None:
        old = sorted(p for p in self.root.glob("step-*") if p.is_dir() and p.name != newest)
        for p in old[:max(0, len(old) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)

    def step_done(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  data: SampleOrder | None = None, compute_seconds: float | None = None,
                  sync_seconds: float | None = None) -> bool:
        """After each step: report, take a periodic checkpoint when due, and when the operator asks for a
        checkpoint, take it on every rank at this step and acknowledge it. True: stop, the set is replaced."""
        if compute_seconds is not None:  # to the agent on this node, for the straggler detector
            self.client.report_step_time(compute_seconds, sync_step_time=sync_seconds)
        request = self.client.pending_checkpoint() if self.rank == 0 else None
        flag = torch.tensor([request.generation if request else 0], dtype=torch.int64)
        dist.broadcast(flag, src=0)  # one small collective a step: every rank stops at the same step
        if int(flag):
            self.save(step, model, optimizer, data, reason="request")
            if request is not None:  # rank 0, which asked
                self._report(step, force=True)
                self.client.acknowledge(request, step)
                log.info("checkpoint generation %d written at step %d: waiting to be replaced", int(flag), step)
            self.stopped_for = int(flag)
            return True
        due = bool(self.interval_steps) and step % self.interval_steps == 0
        if due:
            self.save(step, model, optimizer, data)
        if self.rank == 0:
            if self._restored_meta and self.restore_seconds is None and self._restored_meta.get("reason") == "request":
                # The whole cost of the resize: stop, reschedule, start, rendezvous, reshard-load, first step.
                self.restore_seconds = max(0.0, time.time() - float(self._restored_meta["savedAt"]))
                self._report(step, force=True)
            else:
                self._report(step, force=due)
        return False

    def _report(self, step: int, force: bool = False) -> None:
        rate = (step - self._start_step) / max(1e-9, time.monotonic() - self._started)
        self.client.report_progress(step, rate, self.last_checkpoint, force=force,
                                    restore_seconds=self.restore_seconds)

    def finish(self, step: int) -> None:
        """The end of this worker set: all steps done (rank 0 reports them, every rank exits), or stopped for a
        checkpoint (it waits to be deleted by the operator, and fails if that never comes: restart from it)."""
        if self.stopped_for is None and self.rank == 0:
            self._report(step, force=True)
        dist.destroy_process_group()
        if self.stopped_for is not None:
            time.sleep(self.wait_replaced)
            raise SystemExit(f"checkpoint generation {self.stopped_for} acknowledged at step {step}, but this worker "
                             f"set was not replaced within {self.wait_replaced:.0f}s")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """`python -m flotilla.worker.torch SCRIPT [ARGS]`: torchrun with this pod's place in the worker set."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m flotilla.worker.torch SCRIPT [ARGS...]  (runs torchrun with Flotilla's "
              "rendezvous)", file=sys.stderr)
        return 2
    from torch.distributed.run import main as torchrun

    torchrun([*torchrun_args(), *argv])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
