"""The console at scale: the GPU map's first view in headless Chromium, and the p99 of the data it polls.

Fills a SQLite database with 1,000 nodes of 8 GPUs (8 nodes a rack, 2 % unhealthy, 1 % cordoned) and 15,000
training jobs (1,400 of them running on 4 GPUs each, the rest pending, finished or rejected) and 2,000
decisions, starts `flotilla controller --no-kubernetes` on it in its own process, and measures:

* first view: a fresh page load of /ui/#/map (signed in) until the map is drawn (the page marks the time it
  finished drawing, from the start of navigation); the worst of --loads loads;
* data p99: GET /v1/gpumap (what the map polls every 2 s) against GET /healthz (no database, no auth), the
  two interleaved in the same run from one keep-alive client;
* pages: every page of the console (map, training, a job, serving, nodes, a node, decisions) loads and draws
  its table or map without an error.

    python bench/console.py [--quick] [--requests N] [--loads N]

Last line: {"nodes", "jobs", "first_view_ms", "data_p99_ms", "data_p99_vs_healthz", "pages_ok", "pages"}.
"""

from __future__ import annotations

import argparse
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

from flotilla.controller import db  # noqa: E402  (the schema, to fill it; not the code measured)
from flotilla.testing import browser  # noqa: E402
from flotilla.testing.services import controller_without_kubernetes  # noqa: E402

NODES, JOBS, RUNNING, GPUS_PER_JOB, NODES_PER_RACK, DECISIONS = 1_000, 15_000, 1_400, 4, 8, 2_000
TOKEN = "bench-console-read-token-0123456789"


def fill(url: str, seed: int = 1) -> None:
    rng = random.Random(seed)
    engine = db.create_engine(url)
    db.upgrade(engine)
    now = time.time()
    nodes = [{"name": f"gpu-{i:04d}", "domain": f"nvl-{i:04d}", "total_gpus": 8,
              "labels": {"flotilla.dev/rack": f"rack-{i // NODES_PER_RACK:03d}", "flotilla.dev/nvlink-domain": f"nvl-{i:04d}"},
              "ready": True, "unschedulable": i % 97 == 5, "healthy": i % 50 != 7,
              "health_reason": None if i % 50 != 7 else "XidError", "health_message": None if i % 50 != 7 else "XID 79",
              "taint": None if i % 50 != 7 else {"value": "gpu-fault", "effect": "NoExecute"}, "updated": now}
             for i in range(NODES)]
    free = {n["name"]: 8 for n in nodes if n["healthy"] and not n["unschedulable"]}
    order = list(free)
    jobs, allocations, placed = [], [], 0
    for j in range(JOBS):
        placement: dict[str, int] = {}
        if placed < RUNNING:
            need = GPUS_PER_JOB
            for name in order:
                if free[name]:
                    take = min(free[name], need)
                    free[name] -= take
                    placement[name] = placement.get(name, 0) + take
                    need -= take
                    if not need:
                        break
            placed += 1
            phase = rng.choice(("Running", "Running", "Running", "Resharding"))
        else:
            phase = rng.choice(("Pending", "Succeeded", "Succeeded", "Rejected", "Failed"))
        deadline = now + rng.uniform(-3600, 48 * 3600)
        key = f"team-{j % 20}/job-{j:05d}"
        jobs.append({"key": key, "namespace": f"team-{j % 20}", "name": f"job-{j:05d}", "uid": f"uid-{j}",
                     "phase": phase, "priority": 0, "best_effort": False, "created": now - 7200, "deadline": deadline,
                     "total_steps": 100_000, "steps": rng.randrange(100_000), "steps_per_second": 5.0,
                     "min_gpus": 2, "max_gpus": 16, "gpus": sum(placement.values()), "placement": placement,
                     "estimated_completion": deadline + rng.uniform(-7200, 900), "deadline_met": rng.random() > 0.15,
                     "reshards": rng.randrange(4), "checkpoint_generation": 0, "checkpoint_request": None,
                     "resharding_since": None, "updated": now})
        allocations += [{"job": key, "node": n, "gpus": g} for n, g in placement.items()]
    decisions = [{"time": now - DECISIONS + d, "kind": rng.choice(("allocation", "reshard", "phase", "drain")),
                  "object_kind": "TrainingJob", "object": jobs[d % RUNNING]["key"], "actor": "observed",
                  "reason": "bench", "inputs": {"d": d}} for d in range(DECISIONS)]
    with engine.begin() as conn:
        conn.execute(sa.insert(db.NodeRow), nodes)
        conn.execute(sa.insert(db.TrainingJobRow), jobs)
        conn.execute(sa.insert(db.AllocationRow), allocations)
        conn.execute(sa.insert(db.DecisionRow), decisions)
    engine.dispose()


def p99_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def data_latency(base: str, requests: int) -> tuple[list[float], list[float], int]:
    """GET /v1/gpumap and GET /healthz alternately -> (map latencies, healthz latencies, map answer bytes)."""
    data, healthz, size = [], [], 0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        for _ in range(5):  # warm-up: connection, first queries
            client.get("/v1/gpumap").raise_for_status()
        for _ in range(requests):
            t = time.perf_counter()
            client.get("/healthz").raise_for_status()
            healthz.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = client.get("/v1/gpumap")
            data.append(time.perf_counter() - t)
            r.raise_for_status()
            size = len(r.content)
    return data, healthz, size


def first_views(driver, base: str, loads: int) -> list[float]:
    from selenium.webdriver.common.by import By

    out = []
    for i in range(loads):
        driver.get("about:blank")
        driver.get(f"{base}/ui/#/map")
        ms = browser.wait(driver, lambda d: d.execute_script("return document.body.dataset.mapReady || null"),
                          "the GPU map drawn", timeout=60)
        cells = len(driver.find_elements(By.CSS_SELECTOR, "#gpumap .rack"))
        assert cells > 0, "no rack drawn"
        out.append(float(ms))
        print(f"  load {i + 1}: GPU map drawn {float(ms):.0f} ms after navigation start ({cells} racks)", flush=True)
    return out


PAGES = [("map", "#/map", "#gpumap .rack"), ("training", "#/training", "table[aria-label='training jobs'] tbody tr"),
         ("job", "#/training/team-1/job-00001", "[data-field=phase]"),
         ("serving", "#/serving", "table[aria-label='serving deployments']"),
         ("nodes", "#/nodes", "table[aria-label=nodes] tbody tr"), ("node", "#/nodes/gpu-0007", "[data-field=state]"),
         ("decisions", "#/decisions", "table[aria-label=decisions] tbody tr")]


def pages_ok(driver, base: str) -> int:
    from selenium.webdriver.common.by import By

    ok = 0
    for name, fragment, selector in PAGES:
        driver.get(f"{base}/ui/{fragment}")
        try:
            t = time.perf_counter()
            browser.wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, selector), f"page {name}", timeout=30)
            alerts = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#view [role=alert]") if a.text]
            assert not alerts, alerts
            ok += 1
            print(f"  page {name:10s} ok in {1000 * (time.perf_counter() - t):.0f} ms")
        except AssertionError as e:
            print(f"  page {name:10s} FAILED: {e}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 data requests, 3 page loads")
    ap.add_argument("--requests", type=int, help="data requests (and as many /healthz) (default 1000, quick 200)")
    ap.add_argument("--loads", type=int, help="fresh loads of the GPU map (default 10, quick 3)")
    args = ap.parse_args()
    requests = args.requests or (200 if args.quick else 1000)
    loads = args.loads or (3 if args.quick else 10)
    missing = browser.available()
    if missing:
        print(f"error: the browser half needs {missing} (scripts/install-system-deps.sh, pip install selenium)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="flotilla-bench-console-") as tmp:
        url = f"sqlite:///{tmp}/controller.db"
        t = time.perf_counter()
        fill(url)
        print(f"filled {NODES} nodes, {JOBS} jobs ({RUNNING} running), {DECISIONS} decisions "
              f"in {time.perf_counter() - t:.1f}s", flush=True)
        with controller_without_kubernetes(url, TOKEN) as base:
            data, healthz, size = data_latency(base, requests)
            print(f"GET /v1/gpumap: n={len(data)}, {size / 1024:.0f} KiB, p50 {1000 * sorted(data)[len(data) // 2]:.1f} ms, "
                  f"p99 {p99_ms(data):.1f} ms")
            print(f"GET /healthz  : n={len(healthz)}, p50 {1000 * sorted(healthz)[len(healthz) // 2]:.2f} ms, "
                  f"p99 {p99_ms(healthz):.2f} ms")
            with browser.chromium() as driver:
                browser.sign_in(driver, base, TOKEN)
                views = first_views(driver, base, loads)
                print(f"first view of the GPU map: worst {max(views):.0f} ms, median {sorted(views)[len(views) // 2]:.0f} ms "
                      f"over {loads} loads")
                ok = pages_ok(driver, base)
    result = {"nodes": NODES, "jobs": JOBS, "first_view_ms": round(max(views)), "data_p99_ms": round(p99_ms(data), 1),
              "data_p99_vs_healthz": round(p99_ms(data) / p99_ms(healthz), 1), "pages_ok": ok, "pages": len(PAGES)}
    print(json.dumps(result))
    return 0 if ok == len(PAGES) else 1


if __name__ == "__main__":
    sys.exit(main())
