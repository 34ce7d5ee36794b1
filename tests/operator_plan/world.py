"""A seeded cluster for planning tests and benches: nodes, TrainingJobs of mixed sizes (some finished, some
running, some waiting), ServingDeployments, and a stand-in for the API server that applies what the
operator asks for (status and annotation patches merged, pods created bound where they were pinned and
Running, pods deleted). Objects that change are replaced, never changed in place, as in the view."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

from flotilla.operator import trim
from flotilla.reshard import encoding as checkpoint
from flotilla.reshard.view import worker_set_of
from flotilla.operator.actions import ApplyDeployment, CreatePod, DeletePod, PatchAnnotations, PatchStatus
from flotilla.operator.reconcile import plan
from flotilla.operator.view import key_of, with_patches
from tests.operator_plan.builders import node, trainingjob

SIZES = ((1, 1, 0.70), (4, 4, 0.20), (8, 8, 0.07), (16, 8, 0.03))  # (GPUs, per worker, share)


def job(rng: random.Random, name: str, serial: int) -> dict[str, Any]:
    """Deadlines mostly in submission order (as when every job asks for the same time), a few tighter."""
    gpus, per_worker = rng.choices([(g, w) for g, w, _ in SIZES], [s for _, _, s in SIZES])[0]
    body = trainingjob(name, min_gpus=gpus, max_gpus=gpus, per_worker=per_worker,
                       deadline_seconds=36000 + serial if rng.random() < 0.9 else rng.choice((3600, 7200)))
    body["spec"]["totalSteps"] = rng.randrange(500, 5000)
    return body


class World:
    def __init__(self, seed: int, nodes: int):
        self.rng = random.Random(seed)
        self.nodes = {f"n{i}": node(f"n{i}", rack=f"r{i // 32}") for i in range(nodes)}
        self.jobs: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.servings: dict[str, dict] = {}
        self.deployments: dict[str, dict] = {}
        self.serial = 0

    def grow(self, allocator, now: float, jobs: int, finished: float = 0.0, batch: int = 500, **kw: Any) -> None:
        """Submits `jobs` jobs, a `finished` share of them already Succeeded, `batch` at a time, each batch
        settled (planned in full passes, their actions applied) before the next, as they would be when
        they arrive over time (a pass that admits thousands of jobs at once is not what the operator sees)."""
        for start in range(0, jobs, batch):
            for _ in range(min(batch, jobs - start)):
                body = self.new_job()
                if self.rng.random() < finished:
                    self.jobs[key_of(body)] = trim.trainingjob({**body, "status": {"phase": "Succeeded"}})
            self.settle(allocator, now, **kw)

    def new_job(self) -> dict[str, Any]:
        body = job(self.rng, f"j{self.serial}", self.serial)
        self.serial += 1
        self.jobs[key_of(body)] = body
        return body

    def views(self) -> tuple[dict, dict, dict, dict, dict]:
        """Shallow copies, as the operator hands a pass."""
        return dict(self.jobs), dict(self.nodes), dict(self.pods), dict(self.servings), dict(self.deployments)

    def apply(self, plans: list[tuple[str, str, list]]) -> None:
        for kind, key, actions in plans:
            for a in actions:
                store = self.jobs if kind == "jobs" else self.servings
                if isinstance(a, (PatchStatus, PatchAnnotations)) and key in store:
                    patched = with_patches(store[key], [a])  # trimmed as the view keeps it (a finished job: its phase)
                    store[key] = trim.trainingjob(patched) if kind == "jobs" else patched
                elif isinstance(a, CreatePod):
                    pod = trim.pod(a.manifest)
                    spec = pod["spec"]
                    spec["nodeName"] = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get(
                        "kubernetes.io/hostname")
                    pod["metadata"]["uid"] = f"pod-{self.serial}"
                    self.serial += 1
                    pod["status"] = {"phase": "Running"}
                    self.pods[key_of(pod)] = pod
                elif isinstance(a, DeletePod):
                    self.pods.pop(f"{a.namespace}/{a.name}", None)
                elif isinstance(a, ApplyDeployment):
                    self.deploy(a.manifest)

    def add_serving(self, name: str) -> None:
        """A fixed ServingDeployment: one 1-GPU prefill and one 1-GPU decode instance."""
        pool = {"gpusPerInstance": 1, "template": {"spec": {"containers": [{"name": "s", "image": "vllm"}]}}}
        self.servings[f"ns/{name}"] = {
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 100}, "maxGPUs": 4, "prefill": pool, "decode": pool,
                     "planner": {"mode": "fixed", "prefillReplicas": 1, "decodeReplicas": 1}},
            "status": {}}

    def deploy(self, manifest: dict[str, Any]) -> None:
        """A Deployment applied: ready at once, its pods bound to the last node (as the scheduler might)."""
        meta, replicas = manifest["metadata"], manifest["spec"]["replicas"]
        self.deployments[key_of(manifest)] = {**manifest, "status": {"readyReplicas": replicas, "replicas": replicas}}
        labels = manifest["spec"]["template"]["metadata"]["labels"]
        for i in range(replicas):
            pod = trim.pod({**manifest["spec"]["template"], "metadata": {
                "name": f"{meta['name']}-{i}", "namespace": meta["namespace"], "labels": labels}})
            pod["spec"]["nodeName"] = f"n{len(self.nodes) - 1}"
            pod["status"] = {"phase": "Running"}
            self.pods[key_of(pod)] = pod

    def settle(self, allocator, now: float, rounds: int = 4, **kw: Any) -> None:
        """Full passes, their actions applied, until nothing is left to do or `rounds` ran."""
        for _ in range(rounds):
            plans = plan(now, allocator, *self.views(), **kw)
            if not any(actions for _, _, actions in plans):
                return
            self.apply(plans)

    def pod_of(self, job_key: str) -> list[str]:
        uid = self.jobs[job_key]["metadata"]["uid"]
        return [k for k, p in self.pods.items()
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def finish(self, job_key: str) -> None:
        """Rank 0 exits: the job's pods are Succeeded."""
        for k in self.pod_of(job_key):
            self.pods[k] = {**self.pods[k], "status": {"phase": "Succeeded"}}

    def report_progress(self, job_key: str, steps: int, now: float) -> None:
        body = self.jobs[job_key]
        generation = worker_set_of(body.get("status") or {})
        annotations = {**(body["metadata"].get("annotations") or {}),
                       **checkpoint.progress_annotation(steps, 1.0, now, generation, checkpoint_step=steps)}
        self.jobs[job_key] = {**body, "metadata": {**body["metadata"], "annotations": annotations}}

    def save(self, path: str | Path) -> None:
        state = {"serial": self.serial, **dict(zip(KINDS, self.views()))}
        with gzip.open(path, "wt") as f:
            json.dump(state, f, separators=(",", ":"))

    @classmethod
    def load(cls, path: str | Path, seed: int = 0) -> "World":
        with gzip.open(path, "rt") as f:
            state = json.load(f)
        world = cls(seed, 0)
        world.serial = state["serial"]
        for kind in KINDS:
            setattr(world, kind, state[kind])
        return world


KINDS = ("jobs", "nodes", "pods", "servings", "deployments")  # the order of `World.views`


def main() -> None:
    """Records a settled world (tests/data/): python -m tests.operator_plan.world --jobs 15000 --finished 0.8 OUT"""
    import argparse

    from flotilla.allocation import policies
    from tests.operator_plan.builders import T0

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=15000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=15000)
    parser.add_argument("--finished", type=float, default=0.8)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    world = World(args.seed, args.nodes)
    world.grow(policies.get("elastic-deadline"), T0 + 600, args.jobs, args.finished, args.batch)
    world.save(args.out)


if __name__ == "__main__":
    main()
