"""A real PyTorch job under Flotilla: an MLP learns a fixed random "teacher" network from a synthetic data
set, with FSDP2 (or DDP) over gloo on CPU or NCCL on GPUs, checkpointed with DCP through
flotilla.worker.torch. Resized by the operator, it goes on at the new world size from the acknowledged
step, with the same samples in the same order (the global batch stays the same whatever the world size).

In a pod (examples/torch/trainingjob.yaml) it needs no arguments but the steps; to try it without
Kubernetes, give each rank the environment and a job file:

    python -c "from flotilla.worker.jobfile import FileJobAPI; FileJobAPI.create('/tmp/job.json', 'demo')"
    for r in 0 1; do FLOTILLA_JOB=demo FLOTILLA_NAMESPACE=default FLOTILLA_RANK=$r FLOTILLA_WORLD_SIZE=2 \\
        FLOTILLA_RENDEZVOUS_ADDR=127.0.0.1 FLOTILLA_CHECKPOINT_DIR=/tmp/ckpt \\
        python examples/torch/train.py --total-steps 200 --job-file /tmp/job.json & done; wait

--ledger DIR writes, per rank, every step's samples and loss and every save and restore (JSON lines): what
tests and bench/torch_reshard.py check the run against.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from flotilla.worker.torch import SampleOrder, TorchJob


def teacher_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets: a fixed random two-layer network's outputs, plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w1, w2 = torch.randn(features, 2 * features, generator=g), torch.randn(2 * features, 4, generator=g)
    y = torch.tanh(x @ w1 / features ** 0.5) @ w2 / (2 * features) ** 0.5
    return x, y + 0.01 * torch.randn(y.shape, generator=g)


def student(features: int, width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(features, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def parallelize(model: nn.Module, how: str, device: torch.device, per_layer: bool = False) -> nn.Module:
    model = model.to(device)
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    if per_layer:  # a unit per layer: less memory at once, a collective more per layer and step
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
    return fully_shard(model)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--global-batch", type=int, default=24, help="samples a step, whatever the world size")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", choices=["fsdp", "ddp"], default="fsdp")
    p.add_argument("--fsdp-per-layer", action="store_true", help="shard each layer as its own FSDP unit")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl on GPUs, else gloo")
    p.add_argument("--min-step-seconds", type=float, default=0.0, help="pace the steps (demos)")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="default: FLOTILLA_CHECKPOINT_DIR")
    p.add_argument("--job-file", type=Path, default=None, help="a TrainingJob in a JSON file (no Kubernetes)")
    p.add_argument("--ledger", type=Path, default=None)
    p.add_argument("--dump-restored", type=Path, default=None,
                   help="write the full parameters just restored to DIR/restored-g<generation>.pt")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    api = None
    if args.job_file:
        from flotilla.worker.jobfile import FileJobAPI

        api = FileJobAPI(args.job_file)
    job = TorchJob.from_env(api=api, checkpoint_dir=args.checkpoint_dir)
    job.init_process_group(args.backend)
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    x, y = teacher_data(args.samples, args.features, args.seed)
    model = parallelize(student(args.features, args.width, args.depth), args.parallel, job.device,
                        args.fsdp_per_layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = SampleOrder(args.samples, args.global_batch, args.seed)
    step = job.restore(model, optimizer, data)

    ledger = None
    if args.ledger:
        args.ledger.mkdir(parents=True, exist_ok=True)
        generation = job.client.identity.generation
        ledger = open(args.ledger / f"g{generation}-r{job.rank}.jsonl", "a", buffering=1)
        base = {"generation": generation, "rank": job.rank, "world": job.world_size}

        def write(**fields) -> None:
            ledger.write(json.dumps({**base, **fields}) + "\n")

        if job.load_seconds is not None:
            write(event="restore", step=step, load_s=job.load_seconds)
    if args.dump_restored and job.last_checkpoint is not None:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if job.rank == 0:
            args.dump_restored.mkdir(parents=True, exist_ok=True)
            torch.save({"step": step, "params": full},
                       args.dump_restored / f"restored-g{job.client.identity.generation}.pt")

    while step < args.total_steps:
        started = time.perf_counter()
        ids = data.next_batch(job.rank, job.world_size)
        xb, yb = x[ids].to(job.device), y[ids].to(job.device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        compute = time.perf_counter() - started
        step += 1
        if ledger:
            total = torch.tensor([loss.item() * len(ids), len(ids)], dtype=torch.float64)
            dist.all_reduce(total)
            write(step=step, ids=ids, loss=float(total[0] / total[1]))
        if args.min_step_seconds:
            time.sleep(max(0.0, args.min_step_seconds - (time.perf_counter() - started)))
        saved, measured = job.last_checkpoint, job.restore_seconds
        stop = job.step_done(step, model, optimizer, data, compute_seconds=compute,
                             sync_seconds=time.perf_counter() - started)
        if ledger and job.last_checkpoint != saved:
            write(event="save", step=step, save_s=job.save_seconds, reason="request" if stop else "periodic",
                  position=[data.epoch, data.position])
        if ledger and measured is None and job.restore_seconds is not None:
            write(event="restored", step=step, restore_s=job.restore_seconds)
        if stop:
            break
    if ledger:
        ledger.close()
    job.finish(step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
