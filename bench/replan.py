"""Benchmark: the operator's re-plan time, incremental passes (`reconcile.Planner`) against full re-plans
(`reconcile.plan`, what every pass did before), on a recorded cluster (no API server).

  python bench/replan.py [SNAPSHOT ...] [--passes 60] [--seed 1]

A snapshot (tests/data/world-*.json.gz, recorded by `python -m tests.operator_plan.world`: nodes, jobs
brought to a steady state by the operator's own full passes, their pods; one full re-plan's writes applied to
it first, as the snapshot predates some status fields) is played forward pass by pass,
one simulated second apart. Between two passes (seeded): 0-3 jobs arrive, rank 0 of 1-2 running jobs
exits (its pods Succeeded), 3 running jobs report progress, and the last pass's actions are applied as
the API server would (status and annotation patches merged, pods created bound and Running, deleted).
Each pass is planned twice on the same objects at the same time: by the incremental planner (its full
passes included: every `--full-every` simulated seconds, and on a global change) and by a full re-plan.
Prints per snapshot the live jobs, p50/p99/max of both, and as its last line one JSON object:
{"<snapshot>": {"live_jobs": n, "incremental_ms": {...}, "full_ms": {...}, "incremental_only_ms": {...},
                "incremental_cpu_ms": {...}, "full_cpu_ms": {...},
                "p99_ratio": full p99 / incremental p99, "differing_passes": k}, ...}
(`incremental_only_ms`: the incremental planner's passes that were not full; `*_cpu_ms`: the same passes'
CPU time in this thread, the figure to read on a shared machine; `differing_passes`: passes whose actions
differed between the two, expected 0; `first_pass_cpu_ms`: the planner's first pass, which plans every job,
as after a restart (not in the percentiles); `slowest_passes`: the incremental planner's four slowest passes as
[CPU ms, pass, why it was full or null, jobs planned]; `actions_sha256`: a digest of the full re-plans'
actions (the objects that have some), pass after pass, equal for two versions of the code that decide and act
alike. Before 2026-11 it also hashed the objects a pass planned with no actions, so that it changed when a full
re-plan stopped listing finished jobs (every live job's actions the same).)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from flotilla.allocation import policies  # noqa: E402
from flotilla.operator.actions import CreatePod, DeletePod, PatchAnnotations, PatchStatus  # noqa: E402
from flotilla.operator.reconcile import Planner, plan  # noqa: E402

SNAPSHOTS = (ROOT / "tests/data/world-1000x5000-live.json.gz", ROOT / "tests/data/world-1000x15000.json.gz")
T0 = 1767225600.0 + 600  # the time the snapshots were recorded at


def merge(target, patch):
    """RFC 7386 JSON merge patch (the API server's)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def key(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class Cluster:
    def __init__(self, path: Path, seed: int):
        with gzip.open(path, "rt") as f:
            state = json.load(f)
        self.jobs, self.nodes, self.pods = state["jobs"], state["nodes"], state["pods"]
        self.servings, self.deployments = state["servings"], state["deployments"]
        self.rng, self.serial = random.Random(seed), 0
        # New jobs are copies of the snapshot's jobs as they were submitted (spec only).
        self.templates = [j for j in self.jobs.values() if "spec" in j]

    def views(self):
        return dict(self.jobs), dict(self.nodes), dict(self.pods), dict(self.servings), dict(self.deployments)

    def live(self) -> int:
        return sum(1 for j in self.jobs.values() if (j.get("status") or {}).get("phase") not in
                   ("Succeeded", "Failed", "Rejected"))

    def apply(self, plans) -> None:
        for kind, k, actions in plans:
            store = self.jobs if kind == "jobs" else self.servings
            for a in actions:
                if isinstance(a, PatchStatus) and k in store:
                    store[k] = {**store[k], "status": merge(store[k].get("status"), a.status)}
                elif isinstance(a, PatchAnnotations) and k in store:
                    meta = store[k]["metadata"]
                    store[k] = {**store[k], "metadata": {**meta, "annotations": merge(meta.get("annotations"),
                                                                                        a.annotations)}}
                elif isinstance(a, CreatePod):
                    m = a.manifest
                    spec = m["spec"]
                    node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
                    self.serial += 1
                    self.pods[key(m)] = {
                        "metadata": {**{f: m["metadata"][f] for f in ("name", "namespace", "labels",
                                                                       "ownerReferences", "annotations")
                                        if f in m["metadata"]}, "uid": f"bench-pod-{self.serial}"},
                        "spec": {"nodeName": node, **({"nodeSelector": spec["nodeSelector"]}
                                                      if spec.get("nodeSelector") else {}),
                                 "containers": [{"resources": {"limits": (c.get("resources") or {}).get("limits")
                                                               or {}}} for c in spec["containers"]]},
                        "status": {"phase": "Running"}}
                elif isinstance(a, DeletePod):
                    self.pods.pop(f"{a.namespace}/{a.name}", None)

    def news(self, now: float) -> None:
        rng = self.rng
        for _ in range(rng.randrange(0, 4)):
            body = rng.choice(self.templates)
            self.serial += 1
            name = f"bench-{self.serial}"
            meta = {**body["metadata"], "name": name, "uid": f"uid-{name}", "annotations": {}}
            self.jobs[f"{meta['namespace']}/{name}"] = {**body, "metadata": meta, "status": {}}
        running = [k for k, j in self.jobs.items() if (j.get("status") or {}).get("phase") == "Running"]
        by_uid = {}
        for k, p in self.pods.items():
            for ref in p["metadata"].get("ownerReferences") or []:
                by_uid.setdefault(ref.get("uid"), []).append(k)
        for k in rng.sample(running, min(rng.randrange(1, 3), len(running))):
            for pk in by_uid.get(self.jobs[k]["metadata"]["uid"], []):
                self.pods[pk] = {**self.pods[pk], "status": {"phase": "Succeeded"}}
        for k in rng.sample(running, min(3, len(running))):
            body = self.jobs[k]
            generation = int((body.get("status") or {}).get("reshards", 0))
            progress = json.dumps({"steps": rng.randrange(1, 400), "stepsPerSecond": 1.0,
                                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                                   "generation": generation}, separators=(",", ":"))
            meta = body["metadata"]
            self.jobs[k] = {**body, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                                          "flotilla.dev/progress": progress}}}


def percentiles(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    if not s:
        return {}
    return {"p50": round(statistics.median(s), 1), "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 1),
            "max": round(s[-1], 1), "count": len(s)}


def run(path: Path, passes: int, seed: int, full_every: float) -> dict:
    cluster, allocator = Cluster(path, seed), policies.get("elastic-deadline")
    planner = Planner(full_every=full_every)
    inc, full_ms, inc_only, differing = [], [], [], 0
    inc_cpu, full_cpu = [], []  # this thread's CPU time: on a shared machine the wall clock also counts waiting
    slowest = []  # (CPU ms, pass, why full, jobs planned) of the incremental planner's passes
    digest = hashlib.sha256()  # of the full re-plans' actions, pass after pass: to compare two versions of the code
    # The recorded snapshot predates status.guaranteedShare: brought up to date by a full re-plan's writes,
    # as an operator that restarts finds its cluster (else every job is patched by the first pass and
    # planned again by the next).
    cluster.apply(plan(T0 - 1, allocator, *cluster.views()))
    started_cpu = time.thread_time()
    planner.plan(T0, allocator, *cluster.views())  # the first pass after a start plans every job: not counted
    first_cpu = (time.thread_time() - started_cpu) * 1e3
    for i in range(1, passes + 1):
        now = T0 + i
        cluster.news(now)
        views = cluster.views()
        fulls = planner.full_passes
        started, started_cpu = time.perf_counter(), time.thread_time()
        mine = planner.plan(now, allocator, *views)
        inc.append((time.perf_counter() - started) * 1e3)
        inc_cpu.append((time.thread_time() - started_cpu) * 1e3)
        if planner.full_passes == fulls:
            inc_only.append(inc[-1])
        slowest.append((round(inc_cpu[-1]), i, planner.full_reason, sum(1 for kind, _, _ in mine if kind == "jobs")))
        started, started_cpu = time.perf_counter(), time.thread_time()
        theirs = plan(now, allocator, *views)
        full_ms.append((time.perf_counter() - started) * 1e3)
        full_cpu.append((time.thread_time() - started_cpu) * 1e3)
        got = {(kind, k): a for kind, k, a in mine}
        differing += any(got.get((kind, k), []) != a for kind, k, a in theirs)
        digest.update(repr([entry for entry in theirs if entry[2]]).encode())  # the objects that have actions
        cluster.apply(theirs)
    return {"live_jobs": cluster.live(), "jobs": len(cluster.jobs), "incremental_ms": percentiles(inc),
            "full_ms": percentiles(full_ms), "incremental_only_ms": percentiles(inc_only),
            "incremental_cpu_ms": percentiles(inc_cpu), "full_cpu_ms": percentiles(full_cpu),
            "p99_ratio": round(percentiles(full_ms)["p99"] / percentiles(inc)["p99"], 2),
            "differing_passes": differing, "first_pass_cpu_ms": round(first_cpu, 1), "slowest_passes": sorted(slowest, reverse=True)[:4],
            "actions_sha256": digest.hexdigest()[:16]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", nargs="*", type=Path, default=[p for p in SNAPSHOTS if p.exists()])
    parser.add_argument("--passes", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--full-every", type=float, default=10.0, help="the operator's --resync (seconds)")
    args = parser.parse_args()
    summary = {}
    for path in args.snapshots:
        row = run(path, args.passes, args.seed, args.full_every)
        summary[path.name] = row
        print(f"{path.name}: {row['jobs']} jobs, {row['live_jobs']} live; re-plan ms incremental "
              f"{row['incremental_ms']} (not full: {row['incremental_only_ms']}), full {row['full_ms']}; CPU ms "
              f"incremental {row['incremental_cpu_ms']}, full {row['full_cpu_ms']}; "
              f"p99 x{row['p99_ratio']}; passes whose actions differed: {row['differing_passes']}; first pass (a "
              f"restart: every job planned) CPU ms {row['first_pass_cpu_ms']}; slowest incremental "
              f"passes (CPU ms, pass, why full, jobs planned): {row['slowest_passes']}; full re-plans' actions "
              f"sha256 {row['actions_sha256']}", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
