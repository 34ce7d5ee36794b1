"""Benchmark: what two-worker jobs' headless rendezvous Services cost the control plane.

  python bench/rendezvous_cost.py [--pods 1000] [--stale-services 500] [--repeats 2] [--port-base 19440]
                                  [--state DIR] [--keep-cluster]

On the local control plane of e2e/cluster.sh (started, or reused with its state dir and port base; pod IPs
off the loopback, as bench/scale.py's), each arm creates `--pods` pods in a namespace of its own, bound
straight to KWOK nodes (no scheduler), waits until KWOK has them all Running, deletes them and waits until
they are gone, and reads the CPU seconds of etcd, the API server and the controller manager from /proc
around it. The arms, alternated `--repeats` times:

* `pairs`: the pods in pairs, as the workers of two-worker jobs, with no Service (the baseline);
* `pairs+service`: the same, each pair with its own headless Service created before its pods (what
  Flotilla's operator, JobSet and the Kubeflow training operator make for such a job), so that the
  Endpoints and EndpointSlice controllers follow every pod;
* `stale-services`: the baseline's pods in a namespace that already holds `--stale-services` headless
  Services no pod matches (those of finished jobs, which stay until their job is deleted): every pod event
  is matched against each of them.

Prints one JSON line per arm and, last, a JSON object with each arm's CPU milliseconds per pod over the
baseline's, per component (docs/scale.md, "Rendezvous Services").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
ARMS = ("pairs", "pairs+service", "stale-services")
JOB_LABEL, ROLE_LABEL = "bench.flotilla.dev/job", "bench.flotilla.dev/role"
WAIT_S = 600.0


def headless_service(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {scale.BENCH_LABEL: "rendezvous"}},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {JOB_LABEL: job, ROLE_LABEL: "worker"},
                     "ports": [{"name": "rendezvous", "port": 29500}]}}


def pod(name: str, job: str, node: str, subdomain: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "restartPolicy": "Never",
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [{"name": "worker", "image": "flotilla/bench-worker:0"}]}
    if subdomain:
        spec |= {"hostname": name, "subdomain": subdomain}
    return {"metadata": {"name": name, "labels": {scale.BENCH_LABEL: "rendezvous", JOB_LABEL: job,
                                                  ROLE_LABEL: "worker"}}, "spec": spec}


def run_arm(core: Any, state: Path, arm: str, run: int, pods: int, stale: int, nodes: list[str],
            pool: ThreadPoolExecutor) -> dict[str, Any]:
    ns = f"rdzv-{arm.replace('+', '-')}-{run}-{int(time.time())}"
    core.create_namespace({"metadata": {"name": ns}})
    scale.wait_until("the namespace's default ServiceAccount", lambda: (
        bool(core.list_namespaced_service_account(ns).items), "none yet"), WAIT_S, 1.0)
    if arm == "stale-services":
        list(pool.map(lambda i: core.create_namespaced_service(
            ns, headless_service(f"done-{i:05d}-rdzv", f"done-{uuid.uuid4().hex[:8]}")), range(stale)))
    time.sleep(10)  # the controllers' work on the namespace and its Services, outside the measurement

    def job(j: int) -> None:
        name = f"job-{j:05d}"
        service = f"{name}-rdzv" if arm == "pairs+service" else None
        if service:
            core.create_namespaced_service(ns, headless_service(service, name))
        for rank in range(2):
            core.create_namespaced_pod(ns, pod(f"{name}-w{rank}", name, nodes[(2 * j + rank) % len(nodes)], service))

    def running() -> tuple[bool, str]:
        count = sum(p.status.phase == "Running" for p in core.list_namespaced_pod(ns).items)
        return count >= pods, f"{count} of {pods} running"

    before, started = scale.component_cpu(state), time.monotonic()
    list(pool.map(job, range(pods // 2)))
    scale.wait_until("KWOK to run every pod", running, WAIT_S, 1.0)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    scale.wait_until("the pods to go", lambda: (not core.list_namespaced_pod(ns, limit=1).items, "some left"),
                     WAIT_S, 1.0)
    time.sleep(10)  # the controllers' last Endpoints and EndpointSlice writes
    spent = scale.cpu_during(state, before)
    core.delete_namespace(ns)
    return {"arm": arm, "run": run, "pods": pods, "wall_s": round(time.monotonic() - started, 1),
            **{c: spent.get(c, 0.0) for c in COMPONENTS}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods per arm (in pairs)")
    parser.add_argument("--stale-services", type=int, default=500,
                        help="Services no pod matches, in the stale-services arm")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=20, help="KWOK nodes of a cluster this run starts")
    parser.add_argument("--state", type=Path, default=ROOT / ".flotilla" / "scale" / "cluster")
    parser.add_argument("--port-base", type=int, default=19440)
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args()

    from kubernetes import client, config

    cluster = scale.Cluster(args.state.resolve(), args.port_base, args.nodes, 240, scale.KWOK_POD_WORKERS)
    rows: list[dict[str, Any]] = []
    try:
        cluster.up()
        api = config.new_client_from_config(str(cluster.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        core = client.CoreV1Api(api)
        nodes = [n.metadata.name for n in core.list_node().items if n.metadata.name.startswith("gpu-node-")]
        with ThreadPoolExecutor(16) as pool:
            for run in range(args.repeats):
                for arm in ARMS:
                    rows.append(run_arm(core, cluster.state, arm, run, args.pods, args.stale_services, nodes, pool))
                    print(json.dumps(rows[-1]), flush=True)
                    time.sleep(15)  # the namespace's deletion, before the next arm's clock starts
    finally:
        if cluster.started and not args.keep_cluster:
            cluster.down()

    def ms_per_pod(arm: str, component: str) -> float:
        return 1000 * statistics.median(r[component] for r in rows if r["arm"] == arm) / args.pods

    summary: dict[str, Any] = {"pods": args.pods, "stale_services": args.stale_services, "repeats": args.repeats}
    for component in COMPONENTS:
        base = ms_per_pod("pairs", component)
        summary[component] = {"pairs_ms_per_pod": round(base, 3), **{
            f"{arm}_extra_ms_per_pod": round(ms_per_pod(arm, component) - base, 3) for arm in ARMS[1:]}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
