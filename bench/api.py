"""Load on the controller's read routes: requests per second and p99 latency.

Fills a SQLite database with 10,000 nodes (in 1,250 racks), 1,000 training jobs
(placed on those nodes), 20 serving deployments and 5,000 decisions, starts
`flotilla controller --no-kubernetes` on it in its own process, and drives the
read routes (cluster, domains, job and node lists and details, serving,
decisions) from concurrent keep-alive HTTP clients. The baseline, measured the
same way in the same run, is /healthz (no database, no auth): the ratio says
what the database and the views cost on top of the HTTP stack.

    python bench/api.py [--quick] [--seconds S] [--concurrency C] [--db-url URL]

Last line: {"rps": r, "p99_ms": l} for the read routes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from flotilla.controller import db  # noqa: E402
from flotilla.controller.mirror import DecisionRecord  # noqa: E402
from flotilla.controller.store import Store  # noqa: E402
from flotilla.testing.services import controller_without_kubernetes  # noqa: E402

NODES, JOBS, SERVINGS, DECISIONS, NODES_PER_RACK = 10_000, 1_000, 20, 5_000, 8
TOKEN = "bench-read-token-0123456789"


def fill(url: str, seed: int = 1) -> None:
    rng = random.Random(seed)
    engine = db.create_engine(url)
    db.upgrade(engine)
    now = time.time()
    nodes = [{"name": f"gpu-{i:05d}", "domain": f"rack-{i // NODES_PER_RACK:04d}", "total_gpus": 8,
              "labels": {"flotilla.dev/rack": f"rack-{i // NODES_PER_RACK:04d}"}, "ready": True,
              "unschedulable": i % 97 == 0, "healthy": i % 89 != 0,
              "health_reason": None if i % 89 else "XidError", "health_message": None if i % 89 else "XID 79",
              "taint": None, "updated": now} for i in range(NODES)]
    jobs, allocations = [], []
    for j in range(JOBS):
        placement = {f"gpu-{(j * 7 + k) % NODES:05d}": 4 for k in range(rng.choice((1, 2, 4)))}
        deadline = now + rng.uniform(-600, 36_000)
        jobs.append({"key": f"team-{j % 10}/job-{j:04d}", "namespace": f"team-{j % 10}", "name": f"job-{j:04d}",
                     "phase": rng.choice(("Running", "Running", "Running", "Pending", "Resharding", "Succeeded")),
                     "priority": 0, "best_effort": False, "created": now - 3600, "deadline": deadline,
                     "total_steps": 100_000, "steps": rng.randrange(100_000), "steps_per_second": 5.0,
                     "min_gpus": 4, "max_gpus": 32, "gpus": sum(placement.values()), "placement": placement,
                     "estimated_completion": deadline + rng.uniform(-3600, 600), "deadline_met": rng.random() > 0.2,
                     "reshards": rng.randrange(5), "checkpoint_generation": 0, "checkpoint_request": None,
                     "resharding_since": None, "updated": now})
        allocations += [{"job": jobs[-1]["key"], "node": n, "gpus": g} for n, g in placement.items()]
    servings = [{"key": f"llm/chat-{s}", "namespace": "llm", "name": f"chat-{s}", "planner_mode": "auto",
                 "prefill_replicas": 2, "decode_replicas": 4, "prefill_gpus_per_instance": 1,
                 "decode_gpus_per_instance": 1, "slo": {"ttftMs": 400, "tpotMs": 40, "attainment": 0.9},
                 "observed": {"requestsPerSecond": 10.0, "attainment": 0.92}, "predicted_goodput": 9.5,
                 "last_plan_time": now - 60, "last_plan_reason": "bench", "replan_request": None, "updated": now}
                for s in range(SERVINGS)]
    with engine.begin() as conn:
        conn.execute(sa.insert(db.NodeRow), nodes)
        conn.execute(sa.insert(db.TrainingJobRow), jobs)
        conn.execute(sa.insert(db.AllocationRow), allocations)
        conn.execute(sa.insert(db.ServingDeploymentRow), servings)
    Store(engine).record(DecisionRecord(rng.choice(("allocation", "reshard", "cordon", "plan")), "TrainingJob",
                                        jobs[d % JOBS]["key"], "bench", {"d": d}, time=now - DECISIONS + d)
                         for d in range(DECISIONS))
    engine.dispose()


def read_paths(rng: random.Random) -> list[tuple[str, str]]:
    """(route, path) pairs over every read route, shuffled."""
    paths = []
    for _ in range(200):
        j, n = rng.randrange(JOBS), rng.randrange(NODES)
        job = f"team-{j % 10}/job-{j:04d}"
        paths += [("cluster", "/v1/cluster"), ("domains", "/v1/cluster/domains"), ("jobs", "/v1/jobs"),
                  ("jobs?outlook", "/v1/jobs?outlook=at-risk&limit=50"), ("job", f"/v1/jobs/{job}"),
                  ("nodes", "/v1/nodes"), ("nodes?domain", f"/v1/nodes?domain=rack-{n // NODES_PER_RACK:04d}"),
                  ("node", f"/v1/nodes/gpu-{n:05d}"), ("serving", "/v1/serving"),
                  ("decisions", "/v1/decisions?limit=50"),
                  ("decisions?object", f"/v1/decisions?objectKind=TrainingJob&object={job}")]
    rng.shuffle(paths)
    return paths


async def drive(base: str, paths: list[tuple[str, str]], seconds: float, concurrency: int
                ) -> tuple[float, dict[str, list[float]], int]:
    latencies: dict[str, list[float]] = {}
    errors = 0
    stop = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                                     timeout=30) as client:
            i = k
            while time.perf_counter() < stop:
                route, path = paths[i % len(paths)]
                t = time.perf_counter()
                r = await client.get(path)
                latencies.setdefault(route, []).append(time.perf_counter() - t)
                errors += r.status_code != 200
                i += concurrency

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return time.perf_counter() - start, latencies, errors


def p99_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 s per phase (the whole run well under 60 s)")
    ap.add_argument("--seconds", type=float, help="measuring time per phase (default 20, quick 5)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--db-url", help="database to fill and serve from (default: a temporary SQLite file)")
    args = ap.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    with tempfile.TemporaryDirectory(prefix="flotilla-bench-api-") as tmp:
        url = args.db_url or f"sqlite:///{tmp}/controller.db"
        t = time.perf_counter()
        fill(url)
        print(f"filled {NODES} nodes, {JOBS} jobs, {SERVINGS} serving deployments, {DECISIONS} decisions "
              f"in {time.perf_counter() - t:.1f}s", flush=True)
        with controller_without_kubernetes(url, TOKEN) as base:
            asyncio.run(drive(base, read_paths(random.Random(2))[:50], 1.0, args.concurrency))  # warm-up
            took, by_route, base_err = asyncio.run(drive(base, [("healthz", "/healthz")], seconds,
                                                         args.concurrency))
            base_lat = by_route["healthz"]
            base_rps = len(base_lat) / took
            print(f"baseline /healthz: {base_rps:.0f} req/s, p99 {p99_ms(base_lat):.1f} ms, errors {base_err}")
            took, by_route, err = asyncio.run(drive(base, read_paths(random.Random(3)), seconds, args.concurrency))
            for route, route_lat in sorted(by_route.items()):
                print(f"  {route:18s} n={len(route_lat):5d}  mean {1000 * sum(route_lat) / len(route_lat):6.1f} ms"
                      f"  p99 {p99_ms(route_lat):6.1f} ms")
            lat = [x for route_lat in by_route.values() for x in route_lat]
            rps = len(lat) / took
            print(f"read routes: {rps:.0f} req/s, p50 {1000 * sorted(lat)[len(lat) // 2]:.1f} ms, "
                  f"p99 {p99_ms(lat):.1f} ms, errors {err}, concurrency {args.concurrency}")
            print(f"ratio read/baseline rps: {rps / base_rps:.2f}")
    print(json.dumps({"rps": round(rps, 1), "p99_ms": round(p99_ms(lat), 1)}))
    return 0 if err == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
