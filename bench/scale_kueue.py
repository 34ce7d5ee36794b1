"""Kueue beside Flotilla for bench/scale.py --against kueue: its objects, its process, the side-by-side summary.

Kueue (sigs.k8s.io/kueue, pinned to KUEUE_VERSION, built by e2e/build-kueue.sh) runs as a process against the
bench's control plane, with the configuration it ships (config/components/manager/controller_manager_config.yaml)
changed only where a process outside a cluster needs it: no leader election, no internal cert management (so no
webhooks are registered: Jobs are created suspended, with the queue label, as Kueue documents for integrations
without its webhook), loopback ports of the bench's own, only the batch/job integration; and sized as the
operator is: the client's QPS the operator's (--kueue-qps 200, burst 400; it ships 50, burst 100), 16 workers for
Jobs and for Workloads (--kueue-concurrency, the operator's --concurrency; it ships 5).

The pure builders (manifests, configuration, summary) are unit-tested in tests/bench_scale; KueueProcess needs the
binary and a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

KUEUE_VERSION = "v0.17.0"
KUEUE_GROUP, KUEUE_API = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NAMESPACE = "kueue-system"
CLUSTER_QUEUE, LOCAL_QUEUE, FLAVOR = "bench", "bench", "default"
# Where Kueue v0.17.0 reads its metrics server's certificate when internal cert management is off (hard-coded in
# cmd/kueue/main.go): it exits at once without it.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# Offsets from the cluster's port base (e2e/cluster.sh uses +3..+8).
HEALTH_PORT, METRICS_PORT, WEBHOOK_PORT = 20, 21, 22


def configuration(port_base: int, cert_dir: Path, qps: float, burst: int, workers: int = 5) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): the shipped one, changed as the module doc says;
    `workers`: its reconcilers' for Jobs and Workloads (it ships 5)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{port_base + HEALTH_PORT}"},
        "metrics": {"bindAddress": f"127.0.0.1:{port_base + METRICS_PORT}"},
        # The webhook server starts whatever the configuration says; no webhook configuration points at it.
        "webhook": {"port": port_base + WEBHOOK_PORT, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "controller": {"groupKindConcurrency": {  # as shipped, but for `workers`
            "Job.batch": workers, "Pod": 5, "Workload.kueue.x-k8s.io": workers, "LocalQueue.kueue.x-k8s.io": 1,
            "Cohort.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1}},
        "clientConnection": {"qps": qps, "burst": burst},
        "featureGates": {"VisibilityOnDemand": False},  # else it binds :8082
        "integrations": {"frameworks": ["batch/job"]},
    }


def queue_objects(namespace: str, nodes: int, gpus_per_node: int, gpu_resource: str) -> list[dict[str, Any]]:
    """One ResourceFlavor, one ClusterQueue whose quota is every GPU, CPU and byte of memory of the cluster's
    nodes (so that Kueue admits whatever fits, as the operator does), one LocalQueue in `namespace`."""
    quota = {"cpu": str(96 * nodes), "memory": f"{nodes}Ti", gpu_resource: str(gpus_per_node * nodes)}
    api = f"{KUEUE_GROUP}/{KUEUE_API}"
    return [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
         "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                  "resourceGroups": [{"coveredResources": sorted(quota),
                                      "flavors": [{"name": FLAVOR, "resources": [
                                          {"name": r, "nominalQuota": q} for r, q in sorted(quota.items())]}]}]}},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": CLUSTER_QUEUE}},
    ]


def batch_job(name: str, workers: int, gpus_per_worker: int, labels: dict[str, str], pod_labels: dict[str, str],
              annotations: dict[str, str], tolerations: list[dict[str, Any]], gpu_resource: str,
              subdomain: str | None) -> dict[str, Any]:
    """A batch/v1 Job as a Kueue user writes one without Kueue's webhook: created suspended, with the queue label.
    Several workers run as an Indexed Job (pod hostname `<name>-<index>` under `subdomain`, as JobSet does)."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "tolerations": tolerations,
        "containers": [{"name": "worker", "image": "flotilla/bench-worker:0",
                        "resources": {"limits": {gpu_resource: str(gpus_per_worker)}}}]}
    if subdomain:
        pod_spec["subdomain"] = subdomain
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {**labels, QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {"suspend": True, "parallelism": workers, "completions": workers,
                 "completionMode": "Indexed" if workers > 1 else "NonIndexed",
                 "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec}},
    }


def job_phase(job: dict[str, Any]) -> str:
    """A batch/v1 Job's state as the bench counts it: Succeeded/Failed once its condition says so, Running once
    unsuspended (admitted), else Pending."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return "Succeeded" if c["type"] == "Complete" else "Failed"
    return "Pending" if (job.get("spec") or {}).get("suspend") else "Running"


# --- the process ----------------------------------------------------------------------------------------

def build(root: Path) -> Path:
    """e2e/build-kueue.sh: the directory with `kueue` and `crds/` (builds once, then cached)."""
    result = subprocess.run([str(root / "e2e" / "build-kueue.sh")], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit("e2e/build-kueue.sh failed (its output is above)")
    return Path(result.stdout.strip().splitlines()[-1])


def self_signed(cert_dir: Path) -> None:
    """tls.crt/tls.key for Kueue's webhook and metrics servers (nothing calls them; they must exist)."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kueue",
                    "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt")],
                   check=True, capture_output=True)


def overlay_script(scratch: Path, cert_dir: Path | None) -> str:
    """Shell lines, run inside a new mount namespace, that overlay /etc (its upper layer on a tmpfs at `scratch`)
    and put `cert_dir`'s tls.crt/tls.key at METRICS_CERTS; only the mounts when `cert_dir` is None."""
    certs = f"{scratch}/upper/{METRICS_CERTS.relative_to('/etc')}"
    lines = [f'set -e; mount -t tmpfs tmpfs "{scratch}"; mkdir -p "{certs}" "{scratch}/work"']
    if cert_dir is not None:
        lines.append(f'cp "{cert_dir}/tls.crt" "{cert_dir}/tls.key" "{certs}/"')
    lines.append(f'mount -t overlay overlay -o lowerdir=/etc,upperdir="{scratch}/upper",workdir="{scratch}/work" /etc')
    return "; ".join(lines)


def launch_command(kueue: Path, config: Path, kubeconfig: Path, cert_dir: Path, scratch: Path,
                   unshare: str | None) -> list[str]:
    """The command that starts Kueue with its metrics certificate at METRICS_CERTS.

    With `unshare` (util-linux; root): in a mount namespace of its own, /etc is overlaid with
    kueue/metrics/certs holding `cert_dir`'s files; nothing outside the namespace sees it, and it goes with the
    process. `exec` makes Kueue the child itself, so that its PID is the child's (for /proc). Without `unshare`
    the caller puts the files there itself (ensure_metrics_certs)."""
    run = [str(kueue), "--config", str(config), "--kubeconfig", str(kubeconfig)]
    if unshare is None:
        return run
    return [unshare, "--mount", "--propagation", "private", "--", "sh", "-c",
            overlay_script(scratch, cert_dir) + '; exec "$@"', "kueue", *run]


def can_unshare() -> str | None:
    """`unshare` if this process may make a mount namespace and overlay /etc in it (tried, not assumed)."""
    path = shutil.which("unshare")
    if path is None:
        return None
    with tempfile.TemporaryDirectory() as scratch:
        probe = subprocess.run([path, "--mount", "--propagation", "private", "--", "sh", "-c",
                                overlay_script(Path(scratch), None)], capture_output=True)
    return path if probe.returncode == 0 else None


def ensure_metrics_certs(cert_dir: Path) -> bool:
    """The fallback without a mount namespace: copy the certificate to METRICS_CERTS (needs write access to /etc).
    True if this call created it (the caller removes it at the end)."""
    if (METRICS_CERTS / "tls.crt").exists():
        return False
    try:
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            shutil.copy(cert_dir / f, METRICS_CERTS / f)
    except OSError as e:
        raise SystemExit(f"Kueue {KUEUE_VERSION} needs {METRICS_CERTS}/tls.crt, and neither a mount namespace "
                         f"(unshare) nor writing it worked: {e}") from e
    return True


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    hwm = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    return round(hwm / 1024, 1)


# --- the side-by-side summary -----------------------------------------------------------------------------

PATHS = {"bare_pods": "direct", "kueue": "kueue", "flotilla": "flotilla"}
FIGURES = ("admit_per_s", "p99_submit_to_running_s", "apiserver_cpu_s_per_job", "requests_per_job",
           "admission_cpu_s_per_1000_jobs", "rss_mb")


def path_figures(phase: dict[str, Any]) -> dict[str, float | None]:
    """One phase's report, reduced to the figures the summary compares (None: not measured on that path, as
    the bare path's admission CPU and RSS: it has no admission layer)."""
    admission = phase.get("admission") or {}
    return {"admit_per_s": phase.get("admit_per_s"),
            "p99_submit_to_running_s": phase["job_create_to_running_s"]["p99"],
            "apiserver_cpu_s_per_job": phase["apiserver_s_per_job"],
            "requests_per_job": phase["requests_per_job"],
            "admission_cpu_s_per_1000_jobs": admission.get("cpu_s_per_1000_jobs"),
            "rss_mb": admission.get("peak_rss_mb")}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def targets(flo: dict[str, float | None], kueue: dict[str, float | None]) -> dict[str, bool | None]:
    """Issue 35's targets, Flotilla against Kueue on the same run (None: a figure is missing)."""
    def check(figure: str, ok: Any) -> bool | None:
        a, b = flo[figure], kueue[figure]
        return None if a is None or b is None else bool(ok(a, b))

    return {"apiserver_cpu_per_job_le_kueue": check("apiserver_cpu_s_per_job", lambda a, b: a <= b),
            "p99_le_kueue": check("p99_submit_to_running_s", lambda a, b: a <= b),
            "admit_per_s_ge_kueue": check("admit_per_s", lambda a, b: a >= b),
            "admission_cpu_le_2x_kueue": check("admission_cpu_s_per_1000_jobs", lambda a, b: a <= 2 * b)}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The last line of --against kueue: per path the compared figures, Flotilla over Kueue for each, the targets."""
    paths = {name: path_figures(report[phase]) for name, phase in PATHS.items()}
    flo, kueue = paths["flotilla"], paths["kueue"]
    return {"nodes": report["nodes"], "jobs": report["jobs"], "rate": report["rate"],
            "load_avg_1m": report.get("load_avg_1m"), **paths,
            "flotilla_vs_kueue": {f: ratio(flo[f], kueue[f]) for f in FIGURES},
            "targets": targets(flo, kueue)}


# --- Kueue as a child process -----------------------------------------------------------------------------

class KueueProcess:
    """Kueue started by the bench, its configuration, certificates and log under `workdir`; CPU seconds and peak
    RSS from /proc, as for the operator."""

    def __init__(self, binary: Path, workdir: Path, kubeconfig: Path, port_base: int, qps: float, burst: int,
                 workers: int):
        from flotilla.testing.services import stop_process

        self._stop_process = stop_process
        workdir.mkdir(parents=True, exist_ok=True)
        cert_dir = workdir / "certs"
        self_signed(cert_dir)
        config = workdir / "config.yaml"
        config.write_text(json.dumps(configuration(port_base, cert_dir, qps, burst, workers), indent=1))  # YAML
        self.health = f"http://127.0.0.1:{port_base + HEALTH_PORT}/readyz"
        unshare = can_unshare()
        self.how = "mount namespace (unshare)" if unshare else f"files created in {METRICS_CERTS}"
        self._created_certs = False if unshare else ensure_metrics_certs(cert_dir)
        scratch = workdir / "etc-overlay"
        scratch.mkdir(exist_ok=True)
        self.log_path = workdir / "kueue.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(launch_command(binary, config, kubeconfig, cert_dir, scratch, unshare),
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text()[-2000:]
                raise SystemExit(f"Kueue exited with {self.proc.returncode} before it was ready:\n{tail}")
            try:
                with urllib.request.urlopen(self.health, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"Kueue not ready after {timeout:.0f} s (log: {self.log_path})")
            time.sleep(0.5)

    def cpu_s(self) -> float:
        return cpu_seconds(self.proc.pid)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.proc.pid)

    def throttled(self) -> int:
        """Lines where client-go said it waited on its own rate limiter (--kueue-qps)."""
        return self.log_path.read_text(errors="replace").count("client-side throttling")

    def stop(self) -> None:
        self._stop_process(self.proc)
        self._log.close()
        if self._created_certs:
            shutil.rmtree(METRICS_CERTS.parent.parent, ignore_errors=True)  # /etc/kueue, which this run made
