"""Benchmark: what one request of each kind costs the API server, TrainingJob writes against pod writes.

  python bench/apiserver_cost.py [--count 300] [--port-base 19440] [--state DIR] [--keep-cluster]

On the local control plane of e2e/cluster.sh (started, or reused with its state dir and port base), sends
`--count` requests of each kind, 16 in flight, and reads kube-apiserver's CPU seconds from /proc around each
batch (its idle rate, measured first, taken out). The kinds are the writes of one job on each path of
bench/scale.py: a TrainingJob's create and its status patches (the operator's), a pod's create, binding and
status patch (KWOK's), an Event; then the TrainingJob writes again with every x-kubernetes-validations rule
taken out of the CRD (put back afterwards), which says what the rules cost. The pods name no scheduler and
are bound to a Node object of the bench's own that KWOK does not manage (a node that does not exist would
have the pod garbage collector delete them), so that neither kube-scheduler nor KWOK adds work of its own.
Prints one line per kind and, last, a JSON object with the milliseconds per request and the ratio of a
TrainingJob status patch to a pod status patch (docs/scale.md, "The cost of one request").
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402

GROUP, VERSION, PLURAL = "flotilla.dev", "v1alpha1", "trainingjobs"
NOW = "2026-01-01T00:00:00Z"
NODE = "apicost-unmanaged"  # a Node object no kubelet (and no KWOK) stands behind


def admitted_status(job: scale.Job) -> dict[str, Any]:
    """The operator's first write for a job placed at once: admitted and placed, in one patch."""
    return {"observedGeneration": 1, "deadline": NOW, "policy": "elastic-deadline", "phase": "Admitted",
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                            "message": f"admitted; starts on {job.gpus} GPUs", "lastTransitionTime": NOW}],
            "placement": [{"node": "gpu-node-0001", "gpus": job.gpus}], "gpus": job.gpus,
            "workers": job.workers, "message": "admitted", "estimatedCompletion": NOW, "deadlineMet": True}


def without_rules(crd: Any) -> Any:
    """The CRD with every x-kubernetes-validations rule removed."""
    if isinstance(crd, dict):
        return {k: without_rules(v) for k, v in crd.items() if k != "x-kubernetes-validations"}
    if isinstance(crd, list):
        return [without_rules(v) for v in crd]
    return crd


class Meter:
    """kube-apiserver's CPU seconds around a batch of requests, its idle rate taken out."""

    def __init__(self, state: Path):
        self.pid = int((state / "run" / "kube-apiserver.pid").read_text())
        start = scale.cpu_seconds(self.pid)
        time.sleep(5)
        self.idle = (scale.cpu_seconds(self.pid) - start) / 5

    def per_request_ms(self, send: Callable[[Any], Any], items: list[Any], pool: ThreadPoolExecutor) -> float:
        cpu, started = scale.cpu_seconds(self.pid), time.monotonic()
        list(pool.map(send, items))
        time.sleep(1.0)  # the watch events those requests caused
        spent = scale.cpu_seconds(self.pid) - cpu - self.idle * (time.monotonic() - started)
        return 1000 * spent / len(items)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="requests of each kind")
    parser.add_argument("--nodes", type=int, default=10, help="KWOK nodes of a cluster this run starts")
    parser.add_argument("--state", type=Path, default=ROOT / ".flotilla" / "scale" / "cluster")
    parser.add_argument("--port-base", type=int, default=19440)
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--only", choices=("all", "heartbeats"), default="all",
                        help="heartbeats: only a node Lease's renewal and a node's status heartbeat (what every "
                             "node costs the API server whatever runs on it; docs/scale.md, 10,000 nodes)")
    args = parser.parse_args()

    from kubernetes import client, config

    cluster = scale.Cluster(args.state.resolve(), args.port_base, args.nodes, 240, scale.KWOK_POD_WORKERS)
    results: dict[str, float] = {}
    try:
        cluster.up()
        api = config.new_client_from_config(str(cluster.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        meter = Meter(cluster.state)
        pool = ThreadPoolExecutor(16)
        crd_path = ROOT / "crds" / "trainingjobs.flotilla.dev.yaml"

        def measure(kind: str, send: Callable[[Any], Any], items: list[Any]) -> None:
            results[kind] = round(meter.per_request_ms(send, items, pool), 2)
            print(f"{kind:48s} {results[kind]:6.2f} ms of API-server CPU each", flush=True)

        def trainingjob_writes(suffix: str) -> None:
            ns = f"apicost-{int(time.time())}" + ("-norules" if suffix else "")
            core.create_namespace({"metadata": {"name": ns}})
            jobs = scale.workload(args.count, 7)
            measure(f"create TrainingJob{suffix}", lambda j: custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, scale.trainingjob(j, 10.0, True)), jobs)
            measure(f"TrainingJob status patch: admitted+placed{suffix}",
                    lambda j: custom.patch_namespaced_custom_object_status(
                        GROUP, VERSION, ns, PLURAL, j.name, {"status": admitted_status(j)}), jobs)
            measure(f"TrainingJob status patch: one field{suffix}",
                    lambda j: custom.patch_namespaced_custom_object_status(
                        GROUP, VERSION, ns, PLURAL, j.name, {"status": {"message": f"running {j.name}"}}), jobs)
            core.delete_namespace(ns)

        def heartbeats() -> None:
            """A kubelet's two periodic writes, each on an object of its own (as each node renews its own):
            its Lease's renewTime (every 10 s by default) and a status patch of its Ready condition's heartbeat
            (when anything changed, else every 5 min). The Nodes are the bench's own, small and unmanaged."""
            ns = f"apicost-leases-{int(time.time())}"
            core.create_namespace({"metadata": {"name": ns}})
            coord = client.CoordinationV1Api(api)
            nodes = [f"apicost-hb-{i:05d}" for i in range(args.count)]

            def micro(i: int) -> str:
                return f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{i + 1:06d}Z"  # never .000000: dropped

            for n in nodes:
                coord.create_namespaced_lease(ns, {"metadata": {"name": n}, "spec": {
                    "holderIdentity": n, "leaseDurationSeconds": 40, "renewTime": micro(0)}})
                core.create_node({"metadata": {"name": n, "labels": {scale.BENCH_LABEL: "cost"}}})
            try:
                measure("renew a node Lease", lambda n: coord.patch_namespaced_lease(
                    n, ns, {"spec": {"renewTime": micro(int(time.time()) % 3600)}}), nodes)
                measure("node status heartbeat patch", lambda n: core.patch_node_status(n, {"status": {
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "kubelet is posting ready status", "lastTransitionTime": NOW,
                                    "lastHeartbeatTime": micro(int(time.time()) % 3600).split(".")[0] + "Z"}]}}),
                        nodes)
            finally:
                core.delete_namespace(ns)
                core.delete_collection_node(label_selector=f"{scale.BENCH_LABEL}=cost")

        if args.only == "heartbeats":
            heartbeats()
            print(json.dumps({"ms_per_request": results}))
            return 0
        trainingjob_writes("")
        ns = f"apicost-pods-{int(time.time())}"
        core.create_namespace({"metadata": {"name": ns}})
        core.create_node({"metadata": {"name": NODE, "labels": {scale.BENCH_LABEL: "cost"}}})
        names = [f"p{i:05d}" for i in range(args.count)]
        measure("create pod (no scheduler)", lambda n: core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "labels": {scale.BENCH_LABEL: "cost"}},
            "spec": {"schedulerName": "none", "restartPolicy": "Never", "containers": [
                {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}), names)
        measure("bind pod", lambda n: core.create_namespaced_pod_binding(n, ns, {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": n},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}, _preload_content=False), names)
        measure("pod status patch", lambda n: core.patch_namespaced_pod_status(n, ns, {"status": {
            "phase": "Running", "podIP": "10.128.0.9", "startTime": NOW,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": NOW}]}}), names)
        measure("create Event", lambda n: core.create_namespaced_event(ns, {
            "metadata": {"generateName": "cost-"}, "reason": "Scheduled", "type": "Normal",
            "message": f"Successfully assigned {ns}/{n} to {NODE}", "source": {"component": "bench"},
            "involvedObject": {"kind": "Pod", "name": n, "namespace": ns}}), names)
        core.delete_namespace(ns)
        core.delete_node(NODE)

        crd = yaml.safe_load(crd_path.read_text())
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(without_rules(copy.deepcopy(crd)), f)
            f.flush()
            subprocess.run([*cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", f.name],
                           check=True, capture_output=True)
        try:
            time.sleep(3)
            trainingjob_writes(" (no CRD rules)")
        finally:
            subprocess.run([*cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(crd_path)],
                           check=True, capture_output=True)
        heartbeats()
    finally:
        if cluster.started and not args.keep_cluster:
            cluster.down()
    ratio = results["TrainingJob status patch: admitted+placed"] / max(results["pod status patch"], 1e-3)
    print(json.dumps({"ms_per_request": results, "trainingjob_status_patch_vs_pod_status_patch": round(ratio, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
