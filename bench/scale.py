"""Benchmark: Flotilla at cluster scale on the local control plane, against the stock path in the same run.

  python bench/scale.py [--quick] [--nodes N] [--jobs M] [--rate R] [--keep-cluster] [--against kueue]

Brings up (or reuses) the local control plane of e2e/cluster.sh with N KWOK nodes x 8 GPUs, its KWOK playing pod
stages with --kwok-pod-workers workers (32; KWOK's default of 4, each waiting for its patch's answer, fell behind
on the busier API server of the Flotilla phase: pods started seconds late, jobs ran past the operator's 10 s before
it records Running, whose patches loaded the API server more). Without --rate, a
ramp on the direct path finds the highest rate (jobs/s, halving from 160) at which its submission-to-Running p99
stays within --target-p99, each trial lasting until its jobs would fill the cluster; then two phases run on the
same cluster at that rate, one after the other (the first one's pods deleted in between), with the same client
and the same job mix:

* direct: each job's worker pods are created as bare pods (no Flotilla) and placed by kube-scheduler;
  KWOK ends each pod after the job's duration (annotation flotilla.dev/sim-exit-after);
* flotilla: the operator (`flotilla operator`, a separate process) admits the TrainingJobs, places and
  creates their pods; KWOK ends each worker pod after the job's duration as on the direct path, and the
  job succeeds when rank 0 exits (`--workers kwok`, the default), or `flotilla simworkers --speed S` plays
  rank 0, reporting progress through the API server until the job has done its steps (`--workers simulated`).

Latencies come from the bench's own watches (receive times, millisecond resolution, the same on both paths);
the API server's 1 s timestamps give the secondary figures. The operator's re-plan time, passes, writes,
throttling, admissions and rejections come from its own Prometheus metrics (scraped over HTTP before the first
job and after the last, docs/operator-metrics.md); its CPU seconds and peak RSS, and the API server's CPU seconds, from /proc;
who wrote pods' status, and how far KWOK was behind (`kwok`), from the API server's audit log. Writes a JSON report and a PNG plot into --out and
prints, as its last line:
{"nodes", "jobs", "rate", "admit_per_s", "p99_create_to_running_s", "p99_vs_direct", "operator_rss_mb",
 "writes_per_job", "apiserver_s_per_job_vs_direct", "apiserver_latency_s_per_job_vs_direct",
 "operator_cpu_s_per_1000_jobs"}
(docs/scale.md says what each is).

With --against kueue a third phase runs between the two: Kueue (bench/scale_kueue.py, built by e2e/build-kueue.sh)
admits the same jobs as batch/v1 Jobs against one ClusterQueue of every GPU, kube-controller-manager's Job
controller creates their pods; the last line is then bench/scale_kueue.summary's: per path (bare_pods, kueue,
flotilla) admit_per_s, p99_submit_to_running_s, apiserver_cpu_s_per_job, requests_per_job,
admission_cpu_s_per_1000_jobs, rss_mb; flotilla_vs_kueue for each; and issue 35's targets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from flotilla import GROUP, VERSION  # noqa: E402
from flotilla.allocation import policies  # noqa: E402
from flotilla.resources import names  # noqa: E402
from flotilla.testing.services import free_port, stop_process  # noqa: E402

import scale_kueue  # noqa: E402

GPUS_PER_NODE = 8
BENCH_LABEL = "flotilla.dev/bench"
STEPS_PER_GPU_SECOND = 10.0
FINAL = ("Succeeded", "Failed", "Rejected")


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    gpus_per_worker: int
    seconds: float  # how long the job runs once all its workers run

    @property
    def workers(self) -> int:
        return self.gpus // self.gpus_per_worker


def workload(count: int, seed: int) -> list[Job]:
    """Most jobs small and short, some large (a whole node, two nodes), as on a shared cluster."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        r = rng.random()
        if r < 0.70:
            gpus, per, seconds = 1, 1, rng.uniform(3, 8)
        elif r < 0.90:
            gpus, per, seconds = 4, 4, rng.uniform(4, 10)
        elif r < 0.97:
            gpus, per, seconds = 8, 8, rng.uniform(5, 12)
        else:
            gpus, per, seconds = 16, 8, rng.uniform(5, 12)
        jobs.append(Job(f"job-{i:05d}", gpus, per, round(seconds, 1)))
    return jobs


def exit_after(job: Job) -> dict[str, str]:
    """KWOK's flotilla-pod-exit stage ends a pod with these annotations this long after it started."""
    return {"flotilla.dev/sim-exit-code": "0", "flotilla.dev/sim-exit-after": f"{int(job.seconds * 1000)}ms"}


def trainingjob(job: Job, speed: float, kwok_exit: bool) -> dict[str, Any]:
    """`kwok_exit`: the worker pods end by themselves after the job's duration (rank 0 exiting 0 is the job's
    success); otherwise they run until simulated workers have reported `totalSteps`."""
    rate = STEPS_PER_GPU_SECOND * job.gpus
    template: dict[str, Any] = {"spec": {"containers": [{"name": "worker", "image": "flotilla/bench-worker:0"}]}}
    if kwok_exit:
        template["metadata"] = {"annotations": exit_after(job)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
        "metadata": {"name": job.name, "labels": {BENCH_LABEL: "scale"}},
        "spec": {
            "deadlineSeconds": 3600,
            # What the allocator predicts the job's run time from: the pods' real duration under KWOK, the
            # simulated workers' duration at their speed otherwise.
            "totalSteps": int(rate * job.seconds * (1 if kwok_exit else speed)),
            "elasticity": {"minGPUs": job.gpus, "maxGPUs": job.gpus, "gpusPerWorker": job.gpus_per_worker},
            "throughput": [{"gpus": job.gpus, "stepsPerSecond": rate}],
            "checkpoint": {"intervalSteps": 1_000_000, "restoreSeconds": 5},
            "template": template,
        },
    }


def direct_service(job: Job) -> dict[str, Any] | None:
    """The headless Service a job of several workers needs on the stock path too (as JobSet and the Kubeflow
    training operator make one): rank 0's DNS name for the rendezvous. A job of one worker needs none."""
    if job.workers < 2:
        return None
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{job.name}-rdzv", "labels": {BENCH_LABEL: "scale", names.LABEL_JOB: job.name}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {names.LABEL_JOB: job.name, names.LABEL_ROLE: names.ROLE_WORKER},
                 "ports": [{"name": "rendezvous", "port": 29500}]},
    }


def direct_pods(job: Job) -> list[dict[str, Any]]:
    """The pods Flotilla would create for `job`, minus the placement: kube-scheduler places them."""
    service = direct_service(job)
    return [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job.name}-w{rank}",
                     "labels": {BENCH_LABEL: "scale", names.LABEL_JOB: job.name, names.LABEL_ROLE: names.ROLE_WORKER},
                     "annotations": exit_after(job)},
        "spec": {"restartPolicy": "Never",
                 **({"hostname": f"{job.name}-w{rank}", "subdomain": service["metadata"]["name"]} if service else {}),
                 "tolerations": [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "worker", "image": "flotilla/bench-worker:0",
                                 "resources": {"limits": {names.GPU_RESOURCE: str(job.gpus_per_worker)}}}]},
    } for rank in range(job.workers)]


def submit_direct(core: Any, namespace: str, job: Job) -> None:
    """A job on the stock path: its rendezvous Service, if it needs one, then its pods. The direct path's
    latency runs from its first pod seen, so it leaves that Service's create out (one request, for the 3 % of
    jobs with two workers); Flotilla's runs from the TrainingJob seen and takes in the operator's."""
    if (service := direct_service(job)) is not None:
        core.create_namespaced_service(namespace, service)
    for pod in direct_pods(job):
        core.create_namespaced_pod(namespace, pod)


def servingdeployment(i: int) -> dict[str, Any]:
    """A small always-on ServingDeployment (fixed 1 prefill + 1 decode, one GPU each): with it the
    operator decides through the unified pool's arbiter, as a cluster that also serves would."""
    pool = {"gpusPerInstance": 1,
            "template": {"spec": {"containers": [{"name": "server", "image": "flotilla/bench-server:0"}]}}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingDeployment",
        "metadata": {"name": f"chat-{i}", "labels": {BENCH_LABEL: "scale"}},
        "spec": {"slo": {"ttftMs": 400, "tpotMs": 100}, "maxGPUs": 2, "prefill": pool, "decode": pool,
                 "workload": {"requestsPerSecond": 1, "inputTokens": 512, "outputTokens": 128},
                 "planner": {"mode": "fixed", "prefillReplicas": 1, "decodeReplicas": 1}},
    }


def direct_serving_pods(i: int) -> list[dict[str, Any]]:
    """The direct path's stand-in for servingdeployment(i): two one-GPU pods that run throughout."""
    return [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"chat-{i}-{role}", "labels": {BENCH_LABEL: "scale", names.LABEL_ROLE: role}},
        "spec": {"tolerations": [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "server", "image": "flotilla/bench-server:0",
                                 "resources": {"limits": {names.GPU_RESOURCE: "1"}}}]},
    } for role in (names.ROLE_PREFILL, names.ROLE_DECODE)]


# --- the cluster ---------------------------------------------------------------------------------------

class Cluster:
    """e2e/cluster.sh with a state dir, kubeconfig and port base of the bench's own."""

    def __init__(self, state: Path, port_base: int, nodes: int, lease_seconds: int, kwok_pod_workers: int):
        self.state = state
        self.kubeconfig = state.parent / "kubeconfig"
        self.env = {**os.environ, "FLOTILLA_STATE": str(state), "FLOTILLA_KUBECONFIG": str(self.kubeconfig),
                    "FLOTILLA_PORT_BASE": str(port_base), "FLOTILLA_NODES": str(nodes),
                    "FLOTILLA_GPUS_PER_NODE": str(GPUS_PER_NODE), "FLOTILLA_NODE_LEASE_SECONDS": str(lease_seconds),
                    "FLOTILLA_KWOK_POD_WORKERS": str(kwok_pod_workers),
                    # Pod IPs off the loopback (e2e/cluster.sh's default, for the e2e serving engines): the
                    # Endpoints and EndpointSlice controllers refuse loopback addresses and retry, with a
                    # Warning Event each time, for every Service that selects pods.
                    "FLOTILLA_POD_CIDR": os.environ.get("FLOTILLA_POD_CIDR", "10.128.0.1/16")}
        self.nodes = nodes
        self.started = False
        self.kubectl: list[str] = []  # the command with its kubeconfig, once up() ran

    def _sh(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(ROOT / "e2e" / "cluster.sh"), *args], env=self.env, capture_output=True,
                                text=True)
        if check and result.returncode != 0:
            raise SystemExit(f"e2e/cluster.sh {' '.join(args)} failed:\n{result.stderr[-2000:]}")
        return result

    def up(self) -> None:
        if self._sh("status", check=False).returncode == 0:
            log(f"reusing the cluster in {self.state}")
            self._sh("nodes", str(self.nodes))
        else:
            log(f"starting a cluster in {self.state} with {self.nodes} nodes")
            self.started = True  # from here on, down() cleans up whatever part of it came up
            self._sh("up")
        wanted, running = self.env["FLOTILLA_KWOK_POD_WORKERS"], self.kwok_pod_workers()
        if str(running) != wanted:
            log(f"warning: the reused cluster's KWOK has {running} pod stage workers, not {wanted} (--kwok-pod-workers "
                "applies to a cluster this run starts)")
        kubectl = Path(self._sh("bin").stdout.strip().splitlines()[-1]) / "kubectl"
        self.kubectl = [str(kubectl), "--kubeconfig", str(self.kubeconfig)]
        subprocess.run([*self.kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
                       check=True, capture_output=True)
        subprocess.run([*self.kubectl, "wait", "--for", "condition=established", "--timeout=60s",
                        "crd/trainingjobs.flotilla.dev", "crd/servingdeployments.flotilla.dev"],
                       check=True, capture_output=True)

    def down(self) -> None:
        """e2e/cluster.sh down; logs how long each component took to stop."""
        started, took = time.monotonic(), []
        proc = subprocess.Popen([str(ROOT / "e2e" / "cluster.sh"), "down"], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if (m := re.search(r"stopped (\S+) ", line)):
                took.append(f"{m.group(1)} at {time.monotonic() - started:.1f} s")
        proc.wait()
        log(f"cluster down in {time.monotonic() - started:.1f} s ({', '.join(took)})")

    def kwok_pod_workers(self) -> int | None:
        """KWOK's podPlayStageParallelism as e2e/cluster.sh configured it (None: a cluster from before that)."""
        found = re.search(r"podPlayStageParallelism: (\d+)", (self.state / "kwok-config.yaml").read_text()) \
            if (self.state / "kwok-config.yaml").exists() else None
        return int(found.group(1)) if found else None


class Process:
    """A `flotilla` subcommand as a child process of the bench, its log in a file."""

    def __init__(self, log_path: Path, kubeconfig: Path, *args: str, profile: Path | None = None):
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log_path = log_path
        self._log = open(log_path, "w")
        profiler = ["-m", "cProfile", "-o", str(profile)] if profile else []
        self.proc = subprocess.Popen([sys.executable, *profiler, "-m", "flotilla.cli", *args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def usage(self) -> dict[str, float]:
        """CPU seconds and peak RSS so far, from /proc (Linux)."""
        hwm = next(int(line.split()[1]) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                   if line.startswith("VmHWM:"))
        return {"cpu_s": round(cpu_seconds(self.proc.pid), 2), "peak_rss_mb": round(hwm / 1024, 1)}

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def audit_pod_events(state: Path, namespace: str) -> Iterator[dict[str, Any]]:
    """The API server's audit events about pods in `namespace` (e2e/cluster.sh logs every write)."""
    for path in sorted((state / "logs").glob("audit*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                if f'"namespace":"{namespace}"' in line and '"resource":"pods"' in line:
                    yield json.loads(line)


def pod_status_writers(state: Path, namespace: str) -> dict[str, float]:
    """Status writes per pod in `namespace`, by who made them (the API server's audit log, which
    e2e/cluster.sh keeps for writes): KWOK's stages, the node lifecycle controller marking pods NotReady
    when a node's heartbeat is late, the scheduler... Only the writer tells one cause from another."""
    writes: dict[str, int] = {}
    pods: set[str] = set()
    for event in audit_pod_events(state, namespace):
        ref = event.get("objectRef") or {}
        if event.get("verb") == "create" and not ref.get("subresource"):
            # A pod created with generateName (a Job's) has no name in its create's event: one pod per create.
            pods.add(ref.get("name") or event.get("auditID", str(len(pods))))
        elif ref.get("subresource") == "status" and event.get("verb") in ("patch", "update"):
            writer = writer_of(event.get("userAgent", "?"))
            writes[writer] = writes.get(writer, 0) + 1
    return {w: round(n / max(1, len(pods)), 2) for w, n in sorted(writes.items())}


def writer_of(agent: str) -> str:
    """A client by its User-Agent: the program, and for kube-controller-manager and kube-scheduler the controller
    ("kube-controller-manager/job-controller")."""
    return agent.split("/")[0] + ("/" + agent.rsplit("/", 1)[1] if agent.count("/") > 2 else "")


AUDIT_RECEIVED = re.compile(r'"requestReceivedTimestamp":\s*"([^"]+)"')


def audit_writes(state: Path, since: float, until: float, jobs: int, top: int = 4) -> dict[str, dict[str, Any]]:
    """Every write the API server logged between `since` and `until` (the audit log keeps writes, not reads, nor
    node heartbeats and leases), per job, by writer: {writer: {"per_job": n, "top": {"verb resource": n}}},
    busiest writer first. The API server's own counters give how many requests of each kind, not who sent them."""
    counts: dict[str, dict[str, int]] = {}
    # The log holds every phase: lines outside the window are skipped by their timestamp's text (ISO 8601 in UTC
    # sorts as it reads), unparsed.
    first, last = (datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") for t in (since, until))
    for path in sorted((state / "logs").glob("audit*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                stamp = AUDIT_RECEIVED.search(line)
                if stamp is None or not first <= stamp.group(1) <= last + "Z":
                    continue
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                kind = f"{event.get('verb')} {ref.get('resource', '?')}" + (
                    f"/{ref['subresource']}" if ref.get("subresource") else "")
                mine = counts.setdefault(writer_of(event.get("userAgent", "?")), {})
                mine[kind] = mine.get(kind, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -sum(kv[1].values()))
    return {writer: {"per_job": round(sum(kinds.values()) / max(1, jobs), 2),
                     "top": {k: round(n / max(1, jobs), 2) for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:top]}}
            for writer, kinds in ranked}


def audit_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def kwok_lag(state: Path, namespace: str) -> dict[str, Any]:
    """How far KWOK was behind in `namespace`, from the API server's audit log (microsecond timestamps):
    `running_patch_wait_s`, from a pod's binding (kube-scheduler's, on both paths) to KWOK's first status
    patch of it arriving (the Running stage: the time the pod waited in KWOK's queue for a free worker);
    `patch_s`, how long the API server took over each of KWOK's status patches (a worker waits that long for
    the answer before it takes the next pod); `backlog_max`, the most pods bound and not yet patched at once."""
    bound: dict[str, float] = {}
    patches: dict[str, list[tuple[float, float]]] = {}
    for event in audit_pod_events(state, namespace):
        ref = event.get("objectRef") or {}
        if (event.get("responseStatus") or {}).get("code", 200) >= 300:
            continue
        if ref.get("subresource") == "binding" and event.get("verb") == "create":
            bound[ref["name"]] = audit_time(event["stageTimestamp"])
        elif (ref.get("subresource") == "status" and event.get("verb") == "patch"
              and event.get("userAgent", "").startswith("kwok/")):
            patches.setdefault(ref["name"], []).append(
                (audit_time(event["requestReceivedTimestamp"]), audit_time(event["stageTimestamp"])))
    waits, steps = [], []
    for name, at in bound.items():
        if patches.get(name):
            first = min(patches[name])[0]
            waits.append(first - at)
            steps += [(at, 1), (first, -1)]
    backlog = peak = 0
    for _, step in sorted(steps):
        backlog += step
        peak = max(peak, backlog)
    return {"pods": len(waits), "running_patch_wait_s": percentiles(waits, 3),
            "patch_s": percentiles([done - got for p in patches.values() for got, done in p], 3),
            "backlog_max": peak}


def component_cpu(state: Path) -> dict[str, float]:
    """CPU seconds so far of each control-plane process e2e/cluster.sh started (its PID files), and of this
    bench ("bench": its client's requests and its watches, on the same cores)."""
    out = {"bench": cpu_seconds(os.getpid())}
    for pidfile in sorted((state / "run").glob("*.pid")):
        try:
            out[pidfile.stem] = cpu_seconds(int(pidfile.read_text()))
        except (OSError, ValueError):
            continue
    return out


def cpu_during(state: Path, before: dict[str, float]) -> dict[str, float]:
    return {name: round(t - before.get(name, 0.0), 1) for name, t in component_cpu(state).items()}


METRIC = re.compile(r'^apiserver_request_(total|duration_seconds_sum)\{([^}]*)\} ([0-9.e+-]+)$', re.M)


def api_server_requests(api: Any) -> dict[str, list[float]]:
    """The API server's own request counters: {"VERB resource[/subresource]": [count, seconds]}."""
    auth = {s["key"]: s["value"] for s in api.configuration.auth_settings().values()}
    response = api.call_api("GET", api.configuration.host + "/metrics", header_params=auth)
    response.read()
    out: dict[str, list[float]] = {}
    for kind, labels, value in METRIC.findall(response.data.decode()):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{fields.get('verb')} {fields.get('resource')}" + (
            f"/{fields['subresource']}" if fields.get("subresource") else "")
        out.setdefault(key, [0.0, 0.0])[0 if kind == "total" else 1] += float(value)
    return out


def requests_during(api: Any, before: dict[str, list[float]]) -> dict[str, list[float]]:
    """Every request kind's [count, API-server seconds] since `before` (not watches: they last as long as
    they are open)."""
    diff = {k: [v[0] - before.get(k, [0, 0])[0], v[1] - before.get(k, [0, 0])[1]]
            for k, v in api_server_requests(api).items() if not k.startswith("WATCH")}
    return {k: v for k, v in diff.items() if v[0] > 0}


def busiest(requests: dict[str, list[float]], top: int = 10) -> dict[str, dict[str, float]]:
    ranked = sorted(requests.items(), key=lambda kv: -kv[1][1])[:top]
    return {k: {"count": int(n), "seconds": round(t, 1)} for k, (n, t) in ranked}


# The cluster's own heartbeat (KWOK's node status and leases) goes on whatever runs: not a job's work.
BACKGROUND = re.compile(r"^\S+ (nodes|nodes/status|leases)$")


def apiserver_per_job(cpu: dict[str, float], requests: dict[str, list[float]], jobs: int) -> dict[str, float]:
    """The API server's time per job, two ways:

    * `apiserver_s_per_job`: its CPU seconds during the phase (/proc, the same figure as its own
      process_cpu_seconds_total) over the jobs: the work it did, watches' fan-out included;
    * `apiserver_latency_s_per_job`: the sum of its request durations (apiserver_request_duration_seconds),
      watches and the nodes' heartbeats left out. A request's duration includes the time it waited for a
      CPU: on a saturated machine this sum grows with the load, not only with the work."""
    latency = sum(t for k, (_, t) in requests.items() if not BACKGROUND.match(k))
    count = sum(n for k, (n, _) in requests.items() if not BACKGROUND.match(k))
    return {"apiserver_s_per_job": round(cpu.get("kube-apiserver", 0.0) / jobs, 4),
            "apiserver_latency_s_per_job": round(latency / jobs, 4),
            # Every request but watches and the nodes' heartbeats, reads included, whoever sent it.
            "requests_per_job": round(count / jobs, 2)}


# --- the bench's own watches: receive times with millisecond resolution ---------------------------------

@dataclass
class Seen:
    """What the bench saw of one object on its watch, by its own clock (time.time() at receipt)."""
    first: float  # its first event (ADDED): the bench learnt it exists
    job: str = ""
    generation: int = 0
    running: float | None = None  # a pod: the first event showing its container started (or already ended)
    phase: str = ""
    bound: float | None = None  # a pod: the first event showing it on a node (spec.nodeName)
    admitted: float | None = None  # a TrainingJob (phase past Pending) or a Kueue Job (unsuspended): admitted


class WatchLog(threading.Thread):
    """Watches one collection (raw JSON lines, no model objects) and records when each object was first seen
    and, for pods, when each was first seen started. The API server's own timestamps have 1 s resolution;
    these are the bench's receive times, the same way on both paths."""

    def __init__(self, api: Any, path: str, label_selector: str = ""):
        super().__init__(daemon=True, name=f"watch {path}")
        self.api, self.path, self.selector = api, path, label_selector
        self.seen: dict[str, Seen] = {}
        self.events = 0
        self.stopped = threading.Event()
        self.ready = threading.Event()  # the first watch request is open
        self._response: Any = None  # the watch request open now

    def run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        auth = {s["key"]: s["value"] for s in self.api.configuration.auth_settings().values()}
        version = ""
        while not self.stopped.is_set():
            query = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "240"}
            if version:
                query["resourceVersion"] = version
            if self.selector:
                query["labelSelector"] = self.selector
            url = self.api.configuration.host + self.path + "?" + urlencode(query)
            try:
                response = self._response = self.api.call_api("GET", url, header_params=auth,
                                                              _request_timeout=(10, 300)).response
                if self.stopped.is_set():
                    response.shutdown()
                self.ready.set()
                for line in iter_resp_lines(response):
                    now = time.time()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # 410 Gone: start again from the current state
                        version = ""
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.events += 1
                        self._record(obj, now)
            except Exception as e:  # noqa: BLE001 - a dropped watch is resumed, never the end of the run
                if not self.stopped.is_set():
                    log(f"watch {self.path} resumed after {type(e).__name__}: {e}")
                    time.sleep(0.5)

    def _record(self, obj: dict[str, Any], now: float) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        seen = self.seen.get(meta["name"])
        if seen is None:
            labels = meta.get("labels") or {}
            seen = self.seen[meta["name"]] = Seen(now, labels.get(names.LABEL_JOB, meta["name"]),
                                                  int(labels.get(names.LABEL_GENERATION, 0)))
        seen.phase = scale_kueue.job_phase(obj) if obj.get("kind") == "Job" else status.get("phase", seen.phase)
        if seen.admitted is None and obj.get("kind") in ("TrainingJob", "Job") and seen.phase not in ("", "Pending"):
            seen.admitted = now
        if seen.bound is None and (obj.get("spec") or {}).get("nodeName"):
            seen.bound = now
        if seen.running is None and obj.get("kind", "Pod") == "Pod":
            state = ((status.get("containerStatuses") or [{}])[0].get("state") or {})
            if "running" in state or "terminated" in state:
                seen.running = now

    def stop(self) -> None:
        """Stops it and closes its watch request: an open watch held kube-apiserver's shutdown at the end of a
        run for 30 s, until e2e/cluster.sh killed it."""
        self.stopped.set()
        if self._response is not None:
            try:
                self._response.shutdown()
            except Exception:  # noqa: BLE001 - closed already
                pass


WORKERS = f"{names.LABEL_ROLE}={names.ROLE_WORKER}"


def start_watch(api: Any, path: str, selector: str = "") -> WatchLog:
    watch = WatchLog(api, path, selector)
    watch.start()
    if not watch.ready.wait(30):
        raise SystemExit(f"could not watch {path}")
    return watch


def phase_counts(watch: WatchLog) -> dict[str, int]:
    counts: dict[str, int] = {}
    for seen in list(watch.seen.values()):
        counts[seen.phase or "New"] = counts.get(seen.phase or "New", 0) + 1
    return counts


class _WorkerPod(Protocol):
    job: str
    generation: int


P = TypeVar("P", bound=_WorkerPod)


def last_worker_sets(pods: Iterable[P]) -> dict[str, list[P]]:
    """job -> its pods of the highest worker-set generation seen."""
    last: dict[str, list[P]] = {}
    for p in pods:
        mine = last.setdefault(p.job, [])
        if mine and p.generation > mine[0].generation:
            mine.clear()
        if not mine or p.generation == mine[0].generation:
            mine.append(p)
    return last


def watch_latency(seen: dict[str, Seen], submitted: dict[str, float] | None = None) -> list[float]:
    """Submission to all of a job's workers running, by the bench's receive times: from the job's first pod
    seen (direct path) or the TrainingJob seen (`submitted`, Flotilla) to the last start seen among the pods
    of its last worker set."""
    last = last_worker_sets(seen.values())
    out = []
    for job, pods in last.items():
        if all(p.running is not None for p in pods):
            start = submitted.get(job) if submitted is not None else min(p.first for p in pods)
            if start is not None:
                out.append(max(p.running for p in pods) - start)  # type: ignore[type-var]
    return out


def stages(pods: dict[str, Seen], jobs: dict[str, Seen] | None = None) -> dict[str, dict[str, float | None]]:
    """Each job's way to Running in stages, by the bench's receive times (p50/p90/p99 of each, s): submitted
    (its TrainingJob seen, Flotilla; else its first pod seen) -> admitted (the TrainingJob seen Admitted: the
    operator saw it, planned it and its status patch was answered) -> its first pod seen (the operator's create
    answered) -> the last of its last worker set's pods seen on a node -> seen running."""
    out: dict[str, list[float]] = {}
    for job, mine in last_worker_sets(pods.values()).items():
        if any(p.running is None or p.bound is None for p in mine):
            continue
        created, bound = min(p.first for p in mine), max(p.bound for p in mine)  # type: ignore[type-var]
        running = max(p.running for p in mine)  # type: ignore[type-var]
        steps: list[tuple[str, float | None]] = []
        if jobs is not None:
            tj = jobs.get(job)
            if tj is None or tj.admitted is None:
                continue
            steps += [("submitted", tj.first), ("admitted", tj.admitted)]
        steps += [("pods_created", created), ("bound", bound), ("running", running)]
        for (a, t0), (b, t1) in zip(steps, steps[1:]):
            out.setdefault(f"{a}->{b}", []).append(t1 - t0)  # type: ignore[operator]
    return {name: percentiles(values, 3) for name, values in out.items()}


# --- submitting and waiting ----------------------------------------------------------------------------

def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


def submit_in_waves(jobs: list[Job], waves: int, gap: float, submit: Callable[[Job], Any],
                    concurrency: int, stop: Callable[[], bool] = lambda: False) -> None:
    """`waves` waves of jobs `gap` seconds apart; none after `stop()` says so."""
    size = -(-len(jobs) // waves)
    with ThreadPoolExecutor(concurrency) as pool:
        for w in range(waves):
            if stop():
                return
            started = time.monotonic()
            list(pool.map(submit, jobs[w * size:(w + 1) * size]))
            if w < waves - 1:
                time.sleep(max(0.0, gap - (time.monotonic() - started)))


# How often the bench looks at its own watches for the end of a phase: a phase's CPU and requests are read
# within this much of its last job's end (the same on every path; kept as measured before issue 35's last round).
POLL_SECONDS = 1.0


def wait_until(what: str, done: Callable[[], tuple[bool, str]], timeout: float, interval: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok, progress = done()
        if ok:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}: {progress}")
        time.sleep(interval)


# --- reading the API server's timestamps ----------------------------------------------------------------

def ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class PodTimes:
    job: str
    gpus: int
    created: float
    started: float | None
    finished: float | None
    generation: int = 0


def pod_times(core: Any, namespace: str) -> list[PodTimes]:
    out = []
    for p in core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_ROLE}={names.ROLE_WORKER}").items:
        state = (p.status.container_statuses or [None])[0]
        started = finished = None
        if state is not None and state.state is not None:
            if state.state.running is not None:
                started = ts(state.state.running.started_at)
            elif state.state.terminated is not None:
                started, finished = ts(state.state.terminated.started_at), ts(state.state.terminated.finished_at)
        gpus = int((p.spec.containers[0].resources.limits or {}).get(names.GPU_RESOURCE, "0"))
        out.append(PodTimes(p.metadata.labels[names.LABEL_JOB], gpus, ts(p.metadata.creation_timestamp),
                            started or ts(p.status.start_time), finished,
                            int(p.metadata.labels.get(names.LABEL_GENERATION, 0))))
    return out


def condition_time(status: dict[str, Any], type_: str, value: str = "True") -> float | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == value:
            return ts(c.get("lastTransitionTime"))
    return None


def percentiles(values: list[float], digits: int = 2) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "count": 0}
    v = sorted(values)
    pick = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], digits)  # noqa: E731
    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "count": len(v)}


def pod_latency(pods: list[PodTimes]) -> list[float]:
    return [p.started - p.created for p in pods if p.started is not None]


def job_latency_direct(pods: list[PodTimes]) -> list[float]:
    """Submission to all of a job's workers running: the job's first pod create to its last pod start."""
    by_job: dict[str, list[PodTimes]] = {}
    for p in pods:
        by_job.setdefault(p.job, []).append(p)
    return [max(p.started for p in ps) - min(p.created for p in ps) for ps in by_job.values()
            if all(p.started is not None for p in ps)]


def job_latency_flotilla(items: list[dict[str, Any]], pods: list[PodTimes]) -> list[float]:
    """Submission to all of a job's workers running: the TrainingJob's creation to the last start among the
    pods of its last worker set (KWOK's timestamps, as on the direct path; the operator records Running in
    status.startedAt only at its next pass, and a short job may have ended before)."""
    last = last_worker_sets(pods)
    out = []
    for j in items:
        ps = last.get(j["metadata"]["name"])
        if ps and all(p.started is not None for p in ps):
            out.append(max(p.started for p in ps) - ts(j["metadata"]["creationTimestamp"]))
    return out


def gpus_in_use(pods: list[PodTimes], origin: float, end: float) -> list[tuple[float, int]]:
    """(seconds since origin, GPUs held by running pods) at every start and finish."""
    steps: list[tuple[float, int]] = []
    for p in pods:
        if p.started is not None:
            steps.append((p.started - origin, p.gpus))
            steps.append(((p.finished or end) - origin, -p.gpus))
    out, held = [], 0
    for t, d in sorted(steps):
        held += d
        out.append((round(t, 1), held))
    return out


def last_logged(log_path: Path, what: str) -> dict[str, float]:
    """The last "<what> so far: {...}" the operator logged."""
    found = re.findall(re.escape(what) + r" so far: (\{.*\})", log_path.read_text())
    return json.loads(found[-1]) if found else {}


# The operator's own Prometheus metrics (docs/operator-metrics.md), read over HTTP as Prometheus would: the
# bench measures the operator through its endpoint and imports none of its code.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, timeout: float = 10.0) -> Samples:
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_scrape(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> Samples:
    """The first scrape that answers (the operator serves /metrics a second or two after it starts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(url)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the operator's metrics at {url} did not answer (see operator.log)") from None
            time.sleep(0.2)


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def labelled(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name and label in dict(labels)}


def total(samples: Samples, name: str) -> float:
    """A metric summed over all its labels."""
    return sum(v for (n, _), v in samples.items() if n == name)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """As PromQL's histogram_quantile: linear within the bucket the q-th observation falls in (cumulative counts
    by upper bound; an observation beyond the last finite bound reads as that bound)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-12)
        lower, below = le, buckets[le]
    return lower


def operator_figures(before: Samples, after: Samples) -> dict[str, Any]:
    """The operator's pass and write figures over a phase, from two scrapes of its /metrics."""
    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    hist = "flotilla_operator_pass_duration_seconds"
    buckets = {float(le): v - labelled(before, f"{hist}_bucket", "le").get(le, 0.0)
               for le, v in labelled(after, f"{hist}_bucket", "le").items()}
    passes = delta(f"{hist}_count")
    quantile = {f"p{round(q * 100)}": (round(v * 1e3, 1) if (v := histogram_quantile(q, buckets)) is not None else None)
                for q in (0.5, 0.9, 0.99)}
    # The slowest pass: in the bucket up to the smallest bound that holds every pass.
    busiest = min((le for le, n in buckets.items() if n >= passes), default=None) if passes else None
    return {
        "passes": int(passes),
        "passes_by_kind": {k: int(v - labelled(before, "flotilla_operator_passes_total", "kind").get(k, 0.0))
                           for k, v in labelled(after, "flotilla_operator_passes_total", "kind").items()},
        # histogram_quantile over the pass-duration buckets (2-2.5x apart): a bucket-interpolated figure.
        "replan_ms": {**quantile, "count": int(passes)},
        "replan_ms_mean": round(delta(f"{hist}_sum") * 1e3 / passes, 1) if passes else None,
        "replan_ms_max_bucket": (None if busiest is None else "+Inf" if busiest == float("inf")
                                 else round(busiest * 1e3, 1)),
        "planned_objects_per_pass": round(delta("flotilla_operator_pass_planned_objects_sum") / passes, 1)
        if passes else None,
        "planning_cpu_s": round(delta("flotilla_operator_plan_cpu_seconds_total"), 2),
        "api_requests": int(delta("flotilla_operator_api_requests_total")),
        "api_errors": {k: int(v) for k, v in labelled(after, "flotilla_operator_api_errors_total", "reason").items()},
        "throttled_s": round(delta("flotilla_operator_throttled_seconds_total"), 2),
        "deferred": int(delta("flotilla_operator_deferred_total")),
        "admissions": {k: int(v - labelled(before, "flotilla_operator_admissions_total", "guarantee").get(k, 0.0))
                       for k, v in labelled(after, "flotilla_operator_admissions_total", "guarantee").items()},
        "rejections": {k: int(n) for k, v in labelled(after, "flotilla_operator_rejections_total", "reason").items()
                       if (n := v - labelled(before, "flotilla_operator_rejections_total", "reason").get(k, 0.0))},
        "watch_events": int(total(after, "flotilla_operator_watch_events_total")
                            - total(before, "flotilla_operator_watch_events_total")),
        "relists": int(total(after, "flotilla_operator_relists_total")
                       - total(before, "flotilla_operator_relists_total")),
    }


# --- the two phases -------------------------------------------------------------------------------------

def run_direct(api: Any, namespace: str, jobs: list[Job], args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    log(f"direct: {sum(j.workers for j in jobs)} pods of {len(jobs)} jobs at {args.rate} jobs/s")
    watch = start_watch(api, f"/api/v1/namespaces/{namespace}/pods", WORKERS)
    started, cpu, requests = time.time(), component_cpu(args.state), api_server_requests(api)

    for i in range(args.servings):
        for pod in direct_serving_pods(i):
            core.create_namespaced_pod(namespace, pod)
    submit_in_waves(jobs, args.waves, args.wave_gap, lambda j: submit_direct(core, namespace, j),
                    args.client_concurrency)
    total = sum(j.workers for j in jobs)

    def finished() -> tuple[bool, str]:
        counts = phase_counts(watch)
        return counts.get("Succeeded", 0) + counts.get("Failed", 0) >= total, str(counts)

    wait_until("the direct pods to finish", finished, args.timeout, POLL_SECONDS)
    cpu, requests, until = cpu_during(args.state, cpu), requests_during(api, requests), time.time()
    watch.stop()
    pods = pod_times(core, namespace)
    # The operator sees only its own pods: the stand-ins must not hold GPUs into the Flotilla phase.
    for i in range(args.servings):
        for pod in direct_serving_pods(i):
            core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)

    def servers_gone() -> tuple[bool, str]:
        left = core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_ROLE} in "
                                                                  f"({names.ROLE_PREFILL},{names.ROLE_DECODE})").items
        return not left, f"{len(left)} left"

    wait_until("the direct path's serving pods to go", servers_gone, args.timeout, 0.5)
    end = max((p.finished or time.time()) for p in pods)
    return {
        "pods": len(pods),
        "wall_s": round(end - started, 1),
        "pod_create_to_running_s": percentiles(pod_latency(pods)),
        "job_create_to_running_s": percentiles(watch_latency(watch.seen), 3),
        "stages_s": stages(watch.seen),
        "job_create_to_running_api_s": percentiles(job_latency_direct(pods)),
        "control_plane_cpu_s": cpu,
        "api_server_requests": busiest(requests),
        **apiserver_per_job(cpu, requests, len(jobs)),
        "writes_per_job_by_writer": audit_writes(args.state, started, until, len(jobs)),
        "pod_status_writes_per_pod": pod_status_writers(args.state, namespace),
        "kwok": kwok_lag(args.state, namespace),
        "gpus_in_use": gpus_in_use(pods, started, end),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def keep_partial(report: dict[str, Any], out: Path) -> None:
    """The phases done so far, written as each ends: a full run takes an hour, and a failure in a later phase
    must not lose the earlier ones' figures."""
    (out / "scale-partial.json").write_text(json.dumps(report, indent=1))


def clear_pods(core: Any, namespace: str, timeout: float) -> None:
    """Delete a finished phase's pods before the next phase, so that each phase starts from the same empty
    cluster: finished pods kept in the cluster are work for whatever lists or syncs pods (KWOK lists and
    replays every pod of a node it takes over; a label-selected list, such as the operator's re-list every
    minute, still filters through all of them), and the Flotilla phase, run after the direct one, would pay
    for the direct phase's pods (15,000 of them in the full run)."""
    delete_all(f"the pods in {namespace}",
               lambda: core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0),
               lambda: bool(core.list_namespaced_pod(namespace, limit=1).items), timeout)


def delete_all(what: str, send: Callable[[], Any], left: Callable[[], bool], timeout: float) -> None:
    """Send a deletion of a whole collection (`send`) until one is answered, then wait until `left()` says none is
    left. At 1,000 nodes the API server may give up on such a deletion partway (504) or close its connection
    (15,500 pods, then 15,000 Jobs, 2026-11-28): what it had deleted stays deleted, and the deletion is sent again."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    deleting = [True]  # a deletion of them all is still to be sent (again after a 504 or a dropped connection)

    def gone() -> tuple[bool, str]:
        if deleting[0]:
            try:
                send()
            except ApiException as e:
                if e.status != 504:
                    raise
                return False, "504 from a deletion of them all"
            except HTTPError as e:
                return False, f"a deletion of them all dropped: {type(e).__name__}"
            deleting[0] = False
        return not left(), "some left"

    wait_until(f"{what} to go", gone, timeout, 0.5)


def kueue_job(job: Job) -> dict[str, Any]:
    """`job` as a Kueue user submits it: a batch/v1 Job of the direct path's worker pods (same labels, GPUs,
    tolerations, KWOK exit annotation), suspended, in the bench's LocalQueue."""
    service = direct_service(job)
    return scale_kueue.batch_job(
        job.name, job.workers, job.gpus_per_worker, {BENCH_LABEL: "scale"},
        {BENCH_LABEL: "scale", names.LABEL_JOB: job.name, names.LABEL_ROLE: names.ROLE_WORKER}, exit_after(job),
        [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}], names.GPU_RESOURCE,
        service["metadata"]["name"] if service else None)


def submit_kueue(core: Any, batch: Any, namespace: str, job: Job) -> None:
    """As submit_direct, with the pods in a Job: the rendezvous Service first, if the job needs one."""
    if (service := direct_service(job)) is not None:
        core.create_namespaced_service(namespace, service)
    batch.create_namespaced_job(namespace, kueue_job(job))


def start_kueue(api: Any, cluster: Cluster, kueue_dir: Path, namespace: str, out: Path,
                args: argparse.Namespace) -> scale_kueue.KueueProcess:
    """Kueue's CRDs, its namespace, the process, and the bench's queues once it runs (the ClusterQueue Active)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    crds = kueue_dir / "crds"
    subprocess.run([*cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(crds)],
                   check=True, capture_output=True)
    subprocess.run([*cluster.kubectl, "wait", "--for", "condition=established", "--timeout=60s", "-f", str(crds)],
                   check=True, capture_output=True)
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": scale_kueue.NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise
    kueue = scale_kueue.KueueProcess(kueue_dir / "kueue", out / "kueue", cluster.kubeconfig, args.port_base,
                                     args.kueue_qps, 2 * int(args.kueue_qps), args.kueue_concurrency)
    try:
        queues_ready(api, kueue, cluster, namespace)
    except BaseException:
        kueue.stop()  # nothing else would
        raise
    log(f"kueue: {scale_kueue.KUEUE_VERSION} running (pid {kueue.proc.pid}, metrics certificate by {kueue.how})")
    return kueue


def queues_ready(api: Any, kueue: scale_kueue.KueueProcess, cluster: Cluster, namespace: str) -> None:
    """Kueue ready, the bench's ResourceFlavor, ClusterQueue and LocalQueue made, the ClusterQueue Active."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    kueue.wait_ready(120)
    custom = client.CustomObjectsApi(api)
    for obj in scale_kueue.queue_objects(namespace, cluster.nodes, GPUS_PER_NODE, names.GPU_RESOURCE):
        plural = obj["kind"].lower() + "s"
        if obj["kind"] == "LocalQueue":
            custom.create_namespaced_custom_object(scale_kueue.KUEUE_GROUP, scale_kueue.KUEUE_API, namespace,
                                                   plural, obj)
        else:
            try:
                custom.create_cluster_custom_object(scale_kueue.KUEUE_GROUP, scale_kueue.KUEUE_API, plural, obj)
            except ApiException as e:  # a kept cluster has them from an earlier run
                if e.status != 409:
                    raise

    def active() -> tuple[bool, str]:
        cq: dict[str, Any] = custom.get_cluster_custom_object(  # type: ignore[assignment]
            scale_kueue.KUEUE_GROUP, scale_kueue.KUEUE_API, "clusterqueues", scale_kueue.CLUSTER_QUEUE)
        return condition_time(cq.get("status") or {}, "Active") is not None, str((cq.get("status") or {}))

    wait_until("Kueue's ClusterQueue to be Active", active, 60, 0.5)


def run_kueue(api: Any, namespace: str, jobs: list[Job], kueue: scale_kueue.KueueProcess,
              args: argparse.Namespace, measured: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    """The same jobs as batch/v1 Jobs that Kueue (started by `start_kueue`) admits against a ClusterQueue of every
    GPU; kube-controller-manager's Job controller creates their pods, kube-scheduler places them, KWOK ends them as
    on the other paths. Once everything is measured, `measured()` runs (the next phase's admission layer may start
    meanwhile); Kueue stops at the end, once the Jobs and their pods are deleted (the next phase starts from an
    empty cluster)."""
    from kubernetes import client

    core, batch, custom = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    watches: tuple[WatchLog, ...] = ()
    throttled: int | None = None
    try:
        log(f"kueue: {len(jobs)} batch/v1 Jobs at {args.rate} jobs/s")
        watches = (start_watch(api, f"/api/v1/namespaces/{namespace}/pods", WORKERS),
                   start_watch(api, f"/apis/batch/v1/namespaces/{namespace}/jobs"))
        cpu, api_requests, started_cpu = component_cpu(args.state), api_server_requests(api), kueue.cpu_s()
        since = time.time()
        submit_in_waves(jobs, args.waves, args.wave_gap, lambda j: submit_kueue(core, batch, namespace, j),
                        args.client_concurrency)

        def finished() -> tuple[bool, str]:
            counts = phase_counts(watches[1])
            return sum(counts.get(p, 0) for p in FINAL) >= len(jobs), str(counts)

        wait_until("the Kueue Jobs to finish", finished, args.timeout, POLL_SECONDS)
        admission = admission_usage(kueue.cpu_s() - started_cpu, kueue.peak_rss_mb(), len(jobs))
        cpu, until = cpu_during(args.state, cpu), time.time()
        api_requests = requests_during(api, api_requests)
        items = batch.list_namespaced_job(namespace).items
        workloads: list[dict[str, Any]] = custom.list_namespaced_custom_object(  # type: ignore[index]
            scale_kueue.KUEUE_GROUP, scale_kueue.KUEUE_API, namespace, "workloads")["items"]
        pods = pod_times(core, namespace)
        for w in watches:
            w.stop()
        measured()
        delete_all(f"the Jobs in {namespace}",
                   lambda: batch.delete_collection_namespaced_job(namespace, propagation_policy="Background"),
                   lambda: bool(batch.list_namespaced_job(namespace, limit=1).items), args.timeout)
        clear_pods(core, namespace, args.timeout)
    finally:
        for w in watches:
            w.stop()
        throttled = kueue.throttled()
        kueue.stop()
    admission["client_throttled_lines"] = throttled
    created: dict[str, float] = {}
    for j in items:
        if j.metadata is not None and (t := ts(j.metadata.creation_timestamp)) is not None:
            created[str(j.metadata.name)] = t
    owner = {w["metadata"]["name"]: ((w["metadata"].get("ownerReferences") or [{}])[0].get("name")) for w in workloads}
    admitted = sorted(t for w in workloads if (t := condition_time(w.get("status") or {}, "Admitted")))
    first, end = min(created.values()), max((p.finished or time.time()) for p in pods)
    phases: dict[str, int] = {}
    for seen in watches[1].seen.values():
        phases[seen.phase] = phases.get(seen.phase, 0) + 1
    submitted = {name: seen.first for name, seen in watches[1].seen.items()}
    return {
        "jobs": len(items),
        "phases": phases,
        "workloads": len(workloads),
        "pods": len(pods),
        "admission_wall_s": round(admitted[-1] - first, 1) if admitted else None,
        "admit_per_s": round(len(admitted) / max(1.0, admitted[-1] - first), 2) if admitted else 0.0,
        "wall_s": round(end - first, 1),
        "pod_create_to_running_s": percentiles(pod_latency(pods)),
        "job_create_to_running_s": percentiles(watch_latency(watches[0].seen, submitted), 3),
        "stages_s": stages(watches[0].seen, watches[1].seen),
        # The Job's creation to its Workload's Admitted condition (both 1 s timestamps, as Flotilla's figure).
        "job_create_to_admitted_s": percentiles([
            t - created[job] for w in workloads
            if (t := condition_time(w.get("status") or {}, "Admitted")) and (job := owner[w["metadata"]["name"]])
            in created]),
        "admission": admission,
        "control_plane_cpu_s": cpu,
        "api_server_requests": busiest(api_requests),
        **apiserver_per_job(cpu, api_requests, len(jobs)),
        "writes_per_job_by_writer": audit_writes(args.state, since, until, len(jobs)),
        "pod_status_writes_per_pod": pod_status_writers(args.state, namespace),
        "kwok": kwok_lag(args.state, namespace),
        "admitted_over_time": [round(t - first, 1) for t in admitted],
        "gpus_in_use": gpus_in_use(pods, first, end),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


@dataclass
class Operator:
    """`flotilla operator` as the bench runs it, its /metrics on a port of its own."""

    process: Process
    metrics_url: str


def start_operator(cluster: Cluster, out: Path, args: argparse.Namespace) -> Operator:
    """Started while the previous phase's objects are deleted: its start-up (imports, first lists) is not
    measured (its CPU is counted from the first submission), only waited for."""
    port = free_port()
    process = Process(out / "operator.log", cluster.kubeconfig, "operator", "--liveness", "", "--policy",
                      args.policy, "--concurrency", str(args.operator_concurrency), "--metrics-port", str(port),
                      *(("--batch-seconds", str(args.operator_batch_seconds))
                        if args.operator_batch_seconds is not None else ()),
                      profile=out / "operator.prof" if args.profile_operator else None)
    return Operator(process, f"http://127.0.0.1:{port}/metrics")


def operator_settled(url: str, proc: subprocess.Popen, servings: int, timeout: float) -> Samples:
    """Wait until the operator sees the `servings` ServingDeployments, has planned a pass since (every pass plans
    every ServingDeployment), and has no write on its way: their Deployments are written before the first job, as
    a fixed 3 s sleep used to allow on a quiet machine. Returns that scrape."""
    scraped: list[Samples] = []
    all_seen_at: list[float] = []  # the passes so far when every ServingDeployment was first seen

    def settled() -> tuple[bool, str]:
        m = wait_scrape(url, proc)
        scraped[:] = [m]
        passes = total(m, "flotilla_operator_passes_total")
        seen = sample(m, "flotilla_operator_view_objects", kind="servings")
        busy = sample(m, "flotilla_operator_objects_in_flight")
        if seen >= servings and not all_seen_at:
            all_seen_at.append(passes)
        ok = bool(all_seen_at) and passes > all_seen_at[0] and busy == 0
        return ok, f"{passes:.0f} passes, {seen:.0f} of {servings} ServingDeployments seen, {busy:.0f} writing"

    wait_until("the operator to settle before the first job", settled, timeout, 0.25)
    return scraped[0]


T = TypeVar("T")


def start_beside(start: Callable[[], T], work: Callable[[], Any], stop: Callable[[T], Any]) -> T:
    """`start()` in a thread of its own while `work()` runs here; its result once both are done. Should either
    fail, what `start` started is stopped."""
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start)
        try:
            work()
        except BaseException:
            try:
                stop(starting.result())
            except BaseException:
                pass  # it failed too: the first failure is the one to report
            raise
        return starting.result()


def run_flotilla(api: Any, namespace: str, jobs: list[Job], cluster: Cluster, out: Path,
                 args: argparse.Namespace, started: Operator | None = None) -> dict[str, Any]:
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    op = started or start_operator(cluster, out, args)
    operator, metrics_url = op.process, op.metrics_url
    kwok_exit = args.workers == "kwok"
    watches: tuple[WatchLog, ...] = ()
    workers = None if kwok_exit else Process(
        out / "simworkers.log", cluster.kubeconfig, "simworkers", "--namespace", namespace,
        "--speed", str(args.speed), "--interval", str(args.sim_interval))
    try:
        for i in range(args.servings):
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "servingdeployments",
                                                   servingdeployment(i))
        scraped = operator_settled(metrics_url, operator.proc, args.servings, 120)
        log(f"flotilla: {len(jobs)} TrainingJobs at {args.rate} jobs/s, policy {args.policy}")
        watches = (start_watch(api, f"/api/v1/namespaces/{namespace}/pods", WORKERS),
                   start_watch(api, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trainingjobs"))
        cpu, api_requests = component_cpu(args.state), api_server_requests(api)
        started_cpu = cpu_seconds(operator.proc.pid)  # its start and first lists, before any job
        since = time.time()
        submit_in_waves(jobs, args.waves, args.wave_gap,
                        lambda j: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs",
                                                                         trainingjob(j, args.speed, kwok_exit)),
                        args.client_concurrency)

        def finished() -> tuple[bool, str]:
            counts = phase_counts(watches[1])
            return sum(counts.get(p, 0) for p in FINAL) >= len(jobs), str(counts)

        wait_until("the TrainingJobs to finish", finished, args.timeout, POLL_SECONDS)
        usage = operator.usage()
        final = scrape(metrics_url)  # after usage(): the scrape's own CPU is not counted
        figures = operator_figures(scraped, final)
        cpu, until = cpu_during(args.state, cpu), time.time()
        if workers:
            cpu["simworkers"] = round(cpu_seconds(workers.proc.pid), 1)
        api_requests = requests_during(api, api_requests)
    finally:
        operator.stop()
        if workers:
            workers.stop()
        for w in watches:
            w.stop()
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")["items"]
    pods = pod_times(core, namespace)
    created = [ts(j["metadata"]["creationTimestamp"]) for j in items]
    admitted = sorted(t for j in items if (t := condition_time(j.get("status") or {}, names.COND_ADMITTED)))
    ended = [t for j in items if (t := condition_time(j.get("status") or {}, names.COND_READY, "False"))]
    job_recorded_running = [ts(j["status"]["startedAt"]) - ts(j["metadata"]["creationTimestamp"]) for j in items
                            if (j.get("status") or {}).get("startedAt")]
    job_admitted = [t - ts(j["metadata"]["creationTimestamp"]) for j in items
                    if (t := condition_time(j.get("status") or {}, names.COND_ADMITTED))]
    first, end = min(created), max(ended or [time.time()])
    # All its writes since it started, as before: the ServingDeployments' objects too.
    requests = int(sample(final, "flotilla_operator_api_requests_total"))
    phases: dict[str, int] = {}
    for j in items:
        phases[j["status"]["phase"]] = phases.get(j["status"]["phase"], 0) + 1
    return {
        "jobs": len(items),
        "servings": args.servings,
        "phases": phases,
        "pods": len(pods),
        "admission_wall_s": round(admitted[-1] - first, 1) if admitted else None,
        "admit_per_s": round(len(admitted) / max(1.0, admitted[-1] - first), 2) if admitted else 0.0,
        "wall_s": round(end - first, 1),
        "pod_create_to_running_s": percentiles(pod_latency(pods)),
        "job_create_to_running_s": percentiles(
            watch_latency(watches[0].seen, {name: seen.first for name, seen in watches[1].seen.items()}), 3),
        "stages_s": stages(watches[0].seen, watches[1].seen),
        "job_create_to_running_api_s": percentiles(job_latency_flotilla(items, pods)),
        "job_create_to_recorded_running_s": percentiles(job_recorded_running),
        "job_create_to_admitted_s": percentiles(job_admitted),
        # From the operator's /metrics, scraped before the first job and once all are done (operator_figures):
        # re-plan time (bucket-interpolated), passes, the planning thread's CPU seconds (the share of the
        # operator's CPU that planning took), its writes, throttling, admissions and rejections.
        "replan_ms": figures["replan_ms"],
        "planning_cpu_s": figures["planning_cpu_s"],
        "replan_ms_max": figures["replan_ms_max_bucket"],
        "passes": figures["passes"],
        "operator_metrics": figures,
        "operator": {**usage, "cpu_s_by_thread": last_logged(out / "operator.log", "CPU seconds by thread"),
                     "cpu_s_before_jobs": round(started_cpu, 2), "api_requests": requests,
                     "throttled_s": figures["throttled_s"],
                     "api_requests_per_job": round(requests / len(jobs), 2)},
        "control_plane_cpu_s": cpu,
        "api_server_requests": busiest(api_requests),
        **apiserver_per_job(cpu, api_requests, len(jobs)),
        "pod_status_writes_per_pod": pod_status_writers(args.state, namespace),
        "kwok": kwok_lag(args.state, namespace),
        "status_patches_per_job": {kind: round(n / len(jobs), 3) for kind, n in
                                   last_logged(out / "operator.log", "TrainingJob status patches").items()},
        # The admission layer's own cost, the same way as Kueue's: CPU from the first submission on, peak RSS.
        "admission": admission_usage(usage["cpu_s"] - started_cpu, usage["peak_rss_mb"], len(jobs)),
        "writes_per_job_by_writer": audit_writes(args.state, since, until, len(jobs)),
        "admitted_over_time": [round(t - first, 1) for t in admitted],
        "gpus_in_use": gpus_in_use(pods, first, end),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def admission_usage(cpu_s: float, peak_rss_mb: float, jobs: int) -> dict[str, float]:
    return {"cpu_s": round(cpu_s, 2), "cpu_s_per_1000_jobs": round(cpu_s * 1000 / jobs, 1),
            "peak_rss_mb": peak_rss_mb}


# KWOK's pod stage workers on the bench's cluster (docs/scale.md: measured against 4, KWOK's default).
KWOK_POD_WORKERS = 32
# Jobs/s offered on the direct path, from the top down, until one keeps its p99 within the target.
RAMP = (160.0, 80.0, 40.0, 20.0, 10.0)
# --quick's rate: what the ramp found for 100 nodes on this 2-core machine (docs/scale.md); the ramp would add a
# minute or two to --quick's 3.
QUICK_RATE = 20.0


def trial_seconds(rate: float, mean_gpus: float, cluster_gpus: int, floor: float) -> float:
    """How long a ramp trial offers jobs at `rate`: until the GPUs it asked for add up to the cluster's (had no
    job finished, the cluster would be full), and at least `floor`. A shorter trial ends while GPUs are still
    free and says nothing of the rate sustained once they are not: 12 s trials found 40 jobs/s at 1,000
    nodes, where the direct path's p99 was 0.94 s in the trial and 105 s over the run."""
    return max(floor, cluster_gpus / (rate * mean_gpus))


def beyond_target(seen: dict[str, Seen], now: float, target: float) -> int:
    """Jobs (by their first pod seen) whose submission to Running already took, or is taking, over `target` s."""
    out = 0
    for pods in last_worker_sets(seen.values()).values():
        start = min(p.first for p in pods)
        started = [p.running for p in pods if p.running is not None]
        out += (max(started) if len(started) == len(pods) else now) - start > target
    return out


def find_rate(api: Any, run_id: str, args: argparse.Namespace, cluster_gpus: int) -> tuple[float, list[dict[str, Any]]]:
    """The highest rate of RAMP at which the direct path's submission-to-Running p99 stays within
    `--target-p99`, tried from the top down: each trial offers the job mix (other seeds than the measured
    run's) in a namespace of its own for `trial_seconds` (at most `--jobs` jobs), waits for its pods to start,
    and removes them before the next. A trial stops early once more than 1 % of its jobs are past the target
    (its p99 cannot be within it any more)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    trials: list[dict[str, Any]] = []
    mix = workload(1000, args.seed + 999)
    mean_gpus = sum(j.gpus for j in mix) / len(mix)
    for i, rate in enumerate(RAMP):
        seconds = trial_seconds(rate, mean_gpus, cluster_gpus, args.ramp_seconds)
        count = max(1, min(args.jobs, int(rate * seconds)))
        jobs = [replace(j, name=f"ramp-{j.name}") for j in workload(count, args.seed + 1000 + i)]
        namespace = f"scale-ramp{int(rate)}-{run_id}"
        core.create_namespace({"metadata": {"name": namespace}})
        watch = start_watch(api, f"/api/v1/namespaces/{namespace}/pods", WORKERS)
        stop = threading.Event()

        def past_hope() -> bool:
            if beyond_target(watch.seen, time.time(), args.target_p99) > 0.01 * count:
                stop.set()
            return stop.is_set()

        submit_in_waves(jobs, -(-count // round(rate)), 1.0,
                        lambda j: submit_direct(core, namespace, j),
                        args.client_concurrency, stop=past_hope)
        offered = len({s.job for s in list(watch.seen.values())}) if stop.is_set() else count
        total = sum(j.workers for j in jobs)
        deadline = time.monotonic() + 2 * args.target_p99 + 5
        while (not stop.is_set() and time.monotonic() < deadline
               and sum(s.running is not None for s in list(watch.seen.values())) < total):
            time.sleep(0.5)
        latencies = watch_latency(watch.seen)
        # A job not yet running counts as beyond the target; so do those a trial stopped early did not offer.
        p99 = percentiles(latencies + [float("inf")] * (count - len(latencies)), 3)["p99"]
        watch.stop()
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_until(f"the ramp's pods in {namespace} to go", lambda: (
            not (left := core.list_namespaced_pod(namespace).items), f"{len(left)} left"), 300, 1.0)
        core.delete_namespace(namespace)
        trials.append({"rate": rate, "seconds": round(seconds, 1), "jobs": count, "offered": offered, "p99_s": p99,
                       "stopped_early": stop.is_set()})
        log(f"ramp: {offered} of {count} jobs at {rate:g} jobs/s ({seconds:.0f} s) on the direct path: p99 {p99} s"
            + (" (stopped early: over 1 % of the jobs past the target)" if stop.is_set() else ""))
        if p99 <= args.target_p99:
            return rate, trials
    return RAMP[-1], trials


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for phase, label in (("flotilla", "TrainingJobs admitted (Flotilla)"), ("kueue", "Jobs admitted (Kueue)")):
        if phase in report:
            admitted = report[phase]["admitted_over_time"]
            top.step(admitted, range(1, len(admitted) + 1), where="post", label=label)
    top.set_ylabel("jobs")
    top.legend(loc="lower right")
    for phase, style in (("flotilla", "-"), ("kueue", ":"), ("direct", "--")):
        if phase not in report:
            continue
        series = report[phase]["gpus_in_use"]
        bottom.step([t for t, _ in series], [g for _, g in series], style, where="post", label=phase)
    bottom.axhline(report["nodes"] * GPUS_PER_NODE, color="grey", linewidth=0.8, label="cluster GPUs")
    bottom.set_ylabel("GPUs in use")
    bottom.set_xlabel("seconds since the first submission")
    bottom.legend(loc="upper right")
    fig.suptitle(f"{report['jobs']} jobs on {report['nodes']} nodes x {GPUS_PER_NODE} GPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"100 nodes, 500 jobs at {QUICK_RATE:g} jobs/s unless --rate says otherwise")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=15000)
    parser.add_argument("--rate", default=None,
                        help="jobs offered per second on both paths (a wave every second), or 'auto': the highest "
                             "rate of a ramp at which the direct path's p99 stays within --target-p99 (the "
                             f"default, but {QUICK_RATE:g} with --quick)")
    parser.add_argument("--target-p99", type=float, default=3.0, help="the ramp's bound on the direct path's p99 (s)")
    parser.add_argument("--ramp-seconds", type=float, default=12.0,
                        help="the fewest seconds of submissions per ramp trial (at most --jobs jobs): as long as "
                             "the longest job; a trial lasts until the GPUs its jobs ask for add up to the cluster's")
    parser.add_argument("--workers", choices=("kwok", "simulated"), default="kwok",
                        help="kwok: KWOK ends the worker pods after the job's duration, as on the direct path; "
                             "simulated: `flotilla simworkers` reports progress until the job is done")
    parser.add_argument("--speed", type=float, default=10.0, help="simulated workers run this many times faster")
    parser.add_argument("--sim-interval", type=float, default=1.0,
                        help="seconds between the simulated workers' passes (each lists every job and pod)")
    parser.add_argument("--policy", default=policies.DEFAULT, choices=policies.names(),
                        help="the operator's allocation policy (default: %(default)s)")
    parser.add_argument("--operator-concurrency", type=int, default=16, help="operator's API calls in flight")
    parser.add_argument("--operator-batch-seconds", type=float, default=None,
                        help="the operator's --batch-seconds (default: the operator's own)")
    parser.add_argument("--client-concurrency", type=int, default=16, help="the bench's creates in flight")
    parser.add_argument("--servings", type=int, default=3,
                        help="always-on ServingDeployments (2 GPUs each) beside the jobs, so that the operator "
                             "decides through the unified pool; on the direct path, as many pairs of plain pods")
    parser.add_argument("--node-lease-seconds", type=int, default=240,
                        help="KWOK's node lease for a cluster this run starts (e2e/cluster.sh's default is 40 s: "
                             "1,000 nodes would renew ~100 leases a second on the same 2 cores as everything else)")
    parser.add_argument("--kwok-pod-workers", type=int, default=KWOK_POD_WORKERS,
                        help="KWOK's pod stage workers (podPlayStageParallelism) for a cluster this run starts: each "
                             "waits for its status patch's answer, so KWOK's own default, 4, falls behind on a busy API "
                             "server and pods start late, unlike a cluster with a kubelet per node (default: %(default)s)")
    parser.add_argument("--against", choices=("direct", "kueue"), default="direct",
                        help="direct: bare pods, then Flotilla; kueue: bare pods, then Kueue "
                             f"{scale_kueue.KUEUE_VERSION} admitting batch/v1 Jobs (built by e2e/build-kueue.sh), then "
                             "Flotilla, and the last line compares the three")
    parser.add_argument("--kueue-qps", type=float, default=200.0,
                        help="Kueue's client QPS (burst twice that): the operator's --qps; Kueue ships 50 (burst 100)")
    parser.add_argument("--kueue-concurrency", type=int, default=16,
                        help="Kueue's workers for Jobs and Workloads (groupKindConcurrency): the operator's "
                             "--concurrency; Kueue ships 5")
    parser.add_argument("--phases", default=None,
                        help="a comma-separated subset of the phases --against runs (direct, kueue, flotilla), e.g. "
                             "'flotilla': each phase starts from a fresh cluster state anyway, so a full-size "
                             "comparison can be made a phase at a time with the same --seed and --rate "
                             "(default: all of them)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile-operator", action="store_true",
                        help="run the operator under cProfile (its event-loop thread) into OUT/operator.prof")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for each phase")
    parser.add_argument("--state", type=Path, default=ROOT / ".flotilla" / "scale" / "cluster",
                        help="the cluster's state dir (its kubeconfig goes next to it)")
    parser.add_argument("--port-base", type=int, default=19440, help="FLOTILLA_PORT_BASE of the cluster")
    parser.add_argument("--keep-cluster", action="store_true", help="leave a cluster this run started running")
    parser.add_argument("--out", type=Path, default=ROOT / ".flotilla" / "scale" / "report")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.jobs, args.timeout = 100, 500, 150.0
    if args.rate is None:
        args.rate = str(QUICK_RATE) if args.quick else "auto"
    try:
        args.rate = None if args.rate == "auto" else float(args.rate)
    except ValueError:
        parser.error(f"--rate must be a number of jobs per second or 'auto', not {args.rate!r}")
    if args.nodes < 2 or args.jobs < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("--nodes must be >= 2, --jobs >= 1, --rate > 0")

    args.out.mkdir(parents=True, exist_ok=True)
    args.state = args.state.resolve()
    jobs = workload(args.jobs, args.seed)
    phases = chosen_phases(args.against, args.phases, parser.error)
    # before the cluster: it may fail
    kueue_dir = scale_kueue.build(ROOT) if "kueue" in phases else None
    cluster = Cluster(args.state, args.port_base, args.nodes, args.node_lease_seconds, args.kwok_pod_workers)
    run_id = time.strftime("%H%M%S")
    operators: list[Operator] = []
    measured, downing = False, None
    spaces = {phase: f"scale-{phase}-{run_id}" for phase in phases}
    try:
        cluster.up()
        from kubernetes import client, config

        api = config.new_client_from_config(str(cluster.kubeconfig))
        api.configuration.connection_pool_maxsize = max(args.client_concurrency, 4)
        api.user_agent = "flotilla-bench/scale"  # its writes apart from the operator's in the audit log
        core = client.CoreV1Api(api)
        for ns in spaces.values():
            core.create_namespace({"metadata": {"name": ns}})
        nodes = len(core.list_node(label_selector="type=kwok").items)
        ramp: list[dict[str, Any]] = []
        if args.rate is None:
            args.rate, ramp = find_rate(api, run_id, args, nodes * GPUS_PER_NODE)
        # Waves of round(rate) jobs, one a second (fewer, further apart, below 1 job/s), by `--client-concurrency`
        # threads.
        per_wave = max(1, round(args.rate))
        args.waves, args.wave_gap = -(-len(jobs) // per_wave), per_wave / args.rate
        report: dict[str, Any] = {"nodes": nodes, "jobs": len(jobs), "rate": args.rate, "ramp": ramp,
                                  "kwok_pod_workers": cluster.kwok_pod_workers(),
                                  "workers": args.workers, "speed": args.speed,
                                  "policy": args.policy, "node_lease_s": args.node_lease_seconds,
                                  "gpus_requested": sum(j.gpus for j in jobs),
                                  "worker_pods": sum(j.workers for j in jobs), "against": args.against,
                                  "load_avg_1m": round(os.getloadavg()[0], 2)}
        if "direct" in phases:
            report["direct"] = run_direct(api, spaces["direct"], jobs, args)
            log(f"direct: done in {report['direct']['wall_s']} s")
            keep_partial(report, args.out)

        def clear_direct() -> None:
            if "direct" in phases:
                clear_pods(core, spaces["direct"], args.timeout)

        def start_next() -> None:
            if "flotilla" in phases:
                operators.append(start_operator(cluster, args.out, args))

        # The next phase's admission layer starts while the last phase's objects are deleted: nothing is measured
        # then (each phase's figures are taken from its first submission on, and it starts from an empty cluster).
        if kueue_dir:
            kueue = start_beside(lambda: start_kueue(api, cluster, kueue_dir, spaces["kueue"], args.out, args),
                                 clear_direct, lambda k: k.stop())
            report["kueue"] = run_kueue(api, spaces["kueue"], jobs, kueue, args, measured=start_next)
            report["kueue"].update(version=scale_kueue.KUEUE_VERSION, qps=args.kueue_qps,
                                   workers=args.kueue_concurrency)
            log(f"kueue: done in {report['kueue']['wall_s']} s")
            keep_partial(report, args.out)
        else:
            start_next()
            clear_direct()
        if "flotilla" in phases:
            report["flotilla"] = run_flotilla(api, spaces["flotilla"], jobs, cluster, args.out, args, operators[0])
            log(f"flotilla: done in {report['flotilla']['wall_s']} s")
        measured = True
    finally:
        for op in operators:  # run_flotilla stops it; not when an earlier step failed
            op.process.stop()
        if cluster.started and not args.keep_cluster and measured:
            # Everything is measured: the cluster goes down while the report is written (joined before the
            # last line).
            downing = threading.Thread(target=cluster.down, name="cluster-down")
            downing.start()
        elif cluster.started and not args.keep_cluster:
            cluster.down()
        elif cluster.kubectl:  # a cluster that stays must not keep this run's pods holding GPUs
            for ns in spaces.values():
                subprocess.run([*cluster.kubectl, "delete", "namespace", ns, "--ignore-not-found", "--wait=false"],
                               capture_output=True)

    try:
        last = report_out(report, phases, args, nodes, jobs)
    finally:
        if downing is not None:
            downing.join()
    print(last)
    return 0


def chosen_phases(against: str, chosen: str | None, error: Callable[[str], Any]) -> tuple[str, ...]:
    """The phases to run, in the order they run: all of those `--against` names, or the `--phases` among them."""
    every = ("direct", "kueue", "flotilla") if against == "kueue" else ("direct", "flotilla")
    if chosen is None:
        return every
    names = {p.strip() for p in chosen.split(",") if p.strip()}
    unknown = sorted(names - set(every))
    if unknown or not names:
        error(f"--phases: {', '.join(unknown) or 'none given'} not among {', '.join(every)} (--against {against})")
    return tuple(p for p in every if p in names)


def report_out(report: dict[str, Any], phases: tuple[str, ...], args: argparse.Namespace, nodes: int,
               jobs: list[Job]) -> str:
    """Writes the report and the plot, prints the summary; returns the last line to print."""
    if phases != ("direct", "flotilla") and set(phases) != {"direct", "kueue", "flotilla"}:
        # A subset of the phases (--phases): each one's figures as the side-by-side gives them.
        (args.out / "scale.json").write_text(json.dumps(report, indent=1))
        plot(report, args.out / "scale.png")
        for phase in phases:
            print(f"{phase:9s} wall {report[phase]['wall_s']:7.1f} s, CPU seconds: {report[phase]['control_plane_cpu_s']}")
        print(f"report: {args.out / 'scale.json'}, plot: {args.out / 'scale.png'}")
        return json.dumps({"nodes": nodes, "jobs": len(jobs), "rate": args.rate, "phases": list(phases),
                           **{name: scale_kueue.path_figures(report[phase])
                              for name, phase in scale_kueue.PATHS.items() if phase in phases}})
    flo, direct = report["flotilla"], report["direct"]
    # Submission to Running: a Flotilla pod is created only once its job is placed, so the pods' own
    # create-to-Running (in the report too) leaves out the time the job waits for the operator.
    p99, p99_direct = flo["job_create_to_running_s"]["p99"], direct["job_create_to_running_s"]["p99"]
    # The bench's own receive times: a direct-path p99 under 0.1 s counts as 0.1 s in the ratio.
    report["p99_vs_direct"] = round(p99 / max(p99_direct, 0.1), 2) if p99 is not None else None
    for figure in ("apiserver_s_per_job", "apiserver_latency_s_per_job"):
        report[f"{figure}_vs_direct"] = round(flo[figure] / max(direct[figure], 1e-6), 2)
    if report["ramp"]:  # the direct phase confirms the ramp's rate: that rate sustained over the whole run
        report["ramp_rate_held"] = p99_direct is not None and p99_direct <= args.target_p99
    if "kueue" in report:
        report["side_by_side"] = scale_kueue.summary(report)
    (args.out / "scale.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "scale.png")
    for phase in phases:
        r = report[phase]
        print(f"{phase:9s} wall {r['wall_s']:7.1f} s  pod create->Running {r['pod_create_to_running_s']}  "
              f"job submit->Running {r['job_create_to_running_s']}")
        print(f"{phase:9s} stages (s): " + ", ".join(f"{stage} p50 {v['p50']} p99 {v['p99']}"
                                                      for stage, v in r["stages_s"].items()))
    print(f"flotilla: {flo['phases']}, submit->Admitted {flo['job_create_to_admitted_s']}, "
          f"submit->recorded Running {flo['job_create_to_recorded_running_s']}, "
          f"admitted {flo['admit_per_s']} jobs/s (all in {flo['admission_wall_s']} s), "
          f"re-plan {flo['replan_ms']} ms (max <= {flo['replan_ms_max']}), operator {flo['operator']}, "
          f"of which planning {flo['planning_cpu_s']} CPU-s in {flo['passes']} passes")
    if report["ramp"]:
        print(f"ramp (direct path, p99 target {args.target_p99} s): {report['ramp']} -> {args.rate:g} jobs/s; "
              f"over the run the direct p99 was {p99_direct} s: "
              + ("held" if report["ramp_rate_held"] else "NOT held"))
    if "kueue" in report:
        k = report["kueue"]
        print(f"kueue: {k['phases']}, submit->Admitted {k['job_create_to_admitted_s']}, admitted {k['admit_per_s']} "
              f"jobs/s (all in {k['admission_wall_s']} s), kueue {k['admission']}")
    for phase in phases:
        r = report[phase]
        print(f"CPU seconds during {phase}: {r['control_plane_cpu_s']}")
        print(f"API server during {phase}: {r['apiserver_s_per_job']} CPU-s per job, "
              f"{r['apiserver_latency_s_per_job']} s of request durations per job; busiest: {r['api_server_requests']}")
        print(f"pod status writes per pod during {phase}, by writer: {r['pod_status_writes_per_pod']}")
        print(f"writes per job during {phase}, by writer (audit log): {r['writes_per_job_by_writer']}")
        print(f"KWOK during {phase} ({report['kwok_pod_workers']} pod stage workers): binding -> its Running patch "
              f"{r['kwok']['running_patch_wait_s']} s, each status patch {r['kwok']['patch_s']} s, "
              f"at most {r['kwok']['backlog_max']} pods waiting")
    print(f"the operator's TrainingJob status patches per job, by what they set: {flo['status_patches_per_job']}")
    print(f"report: {args.out / 'scale.json'}, plot: {args.out / 'scale.png'}")
    if "kueue" in report:
        return json.dumps(report["side_by_side"])
    return json.dumps({"nodes": nodes, "jobs": len(jobs), "rate": args.rate, "admit_per_s": flo["admit_per_s"],
                      "p99_create_to_running_s": p99, "p99_vs_direct": report["p99_vs_direct"],
                      "operator_rss_mb": flo["operator"]["peak_rss_mb"],
                      "writes_per_job": flo["operator"]["api_requests_per_job"],
                      "apiserver_s_per_job_vs_direct": report["apiserver_s_per_job_vs_direct"],
                      "apiserver_latency_s_per_job_vs_direct": report["apiserver_latency_s_per_job_vs_direct"],
                      "operator_cpu_s_per_1000_jobs": round(flo["operator"]["cpu_s"] * 1000 / len(jobs), 1)})


if __name__ == "__main__":
    sys.exit(main())
