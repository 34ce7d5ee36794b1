"""Benchmark: what the unified pool adds to one operator reconcile pass (pure, no API server).

  python bench/reconcile_pass.py [--quick]

Builds the objects the operator watches (N nodes x 8 GPUs, M running one-GPU TrainingJobs with their
worker pods, a queue of pending ones) and times the operator's full reconcile pass (a fresh
`operator.reconcile.Planner`'s first pass, as after a start or a node change) in the same process twice: with no ServingDeployment (the elastic allocator alone, the baseline; the serving pods are
then GPUs it may not use) and with one (the pool arbiter decides for both). Prints one line per size, then, as its last line, one JSON object:
{"<nodes>x<jobs>": {"no_serving_ms": a, "pool_ms": b, "ratio": b/a}, ...} (medians of the repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flotilla.allocation import policies  # noqa: E402
from flotilla.operator.reconcile import Planner  # noqa: E402
from flotilla.operator.training import pod_name  # noqa: E402
from flotilla.pool import PoolPolicy  # noqa: E402

CREATED = "2026-01-01T00:00:00Z"
NOW = 1767225600.0 + 60
# 1000 x 8500: 7,984 jobs running and 516 waiting; each waiting job's admission attempt costs time
# proportional to the admitted jobs, so a backlog, not the job count alone, drives the pass time.
FULL = ((100, 500), (300, 2000), (1000, 5000), (1000, 8500))
QUICK = ((100, 500), (300, 2000))


def _node(name: str) -> dict:
    return {"metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _job(name: str, node: str | None) -> dict:
    status = {}
    if node:
        status = {"phase": "Running", "reshards": 0, "placement": [{"node": node, "gpus": 1}], "gpus": 1,
                  "startedAt": CREATED, "deadline": "2026-01-01T10:00:00Z", "policy": "elastic-deadline",
                  "observedGeneration": 1}
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "bench", "uid": name, "generation": 1,
                         "creationTimestamp": CREATED},
            "spec": {"deadlineSeconds": 36000, "totalSteps": 1000, "elasticity": {"minGPUs": 1, "maxGPUs": 1},
                     "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}],
                     "template": {"spec": {"containers": [{"name": "w", "image": "img"}]}}},
            "status": status}


def _pod(job: str, node: str) -> dict:
    return {"metadata": {"name": pod_name(job, job, 0, 0), "namespace": "bench",
                         "labels": {"flotilla.dev/job": job, "flotilla.dev/job-uid": job, "flotilla.dev/role": "worker",
                                    "flotilla.dev/generation": "0"},
                         "ownerReferences": [{"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob",
                                              "name": job, "uid": job, "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _serving() -> dict:
    pool = {"gpusPerInstance": 1, "template": {"spec": {"containers": [{"name": "s", "image": "vllm"}]}}}
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": "bench", "uid": "chat", "generation": 1},
            "spec": {"slo": {"ttftMs": 400, "tpotMs": 100}, "maxGPUs": 8, "prefill": pool, "decode": pool,
                     "planner": {"mode": "fixed", "prefillReplicas": 1, "decodeReplicas": 1}},
            "status": {}}


def _serving_pod(role: str, node: str) -> dict:
    return {"metadata": {"name": f"chat-{role}", "namespace": "bench",
                         "labels": {"flotilla.dev/serving": "chat", "flotilla.dev/role": role}},
            "spec": {"nodeName": node, "containers": [{"name": "s", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def cluster(nodes: int, jobs: int) -> tuple[dict, dict, dict]:
    """Every GPU but 16 runs a one-GPU job; the rest of the jobs wait. The serving deployment (when
    there is one) already runs its two instances on the last node."""
    node_objs = {f"n{i}": _node(f"n{i}") for i in range(nodes)}
    job_objs, pods = {}, {}
    for i in range(jobs):
        node = f"n{i // 8}" if i < nodes * 8 - 16 else None
        job_objs[f"bench/j{i}"] = _job(f"j{i}", node)
        if node:
            pod = _pod(f"j{i}", node)
            pods[f"bench/{pod['metadata']['name']}"] = pod
    for role in ("prefill", "decode"):
        pods[f"bench/chat-{role}"] = _serving_pod(role, f"n{nodes - 1}")
    return node_objs, job_objs, pods


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two smaller sizes only (about 5 s)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    allocator, policy = policies.get("elastic-deadline"), PoolPolicy()
    summary = {}
    for n, m in QUICK if args.quick else FULL:
        nodes, jobs, pods = cluster(n, m)
        times: dict[str, list[float]] = {"no_serving_ms": [], "pool_ms": []}
        for _ in range(args.repeats):
            for label, servings in (("no_serving_ms", {}), ("pool_ms", {"bench/chat": _serving()})):
                started = time.perf_counter()
                Planner().plan(NOW, allocator, jobs, nodes, pods, servings, {}, pool=policy)
                times[label].append((time.perf_counter() - started) * 1e3)
        row = {k: round(statistics.median(v), 1) for k, v in times.items()}
        row["ratio"] = round(row["pool_ms"] / row["no_serving_ms"], 2)
        summary[f"{n}x{m}"] = row
        print(f"{n:>5} nodes {m:>6} jobs: no serving {row['no_serving_ms']:8.1f} ms, with the pool "
              f"{row['pool_ms']:8.1f} ms (x{row['ratio']})", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
