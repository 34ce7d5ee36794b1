"""Small helpers the e2e tests share: kubectl, waiting, the operator as a process."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from flotilla.testing.services import free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]


def kubectl_path() -> str:
    explicit = os.environ.get("FLOTILLA_KUBECTL")
    if explicit:
        return explicit
    found = shutil.which("kubectl")
    if found:
        return found
    raise RuntimeError("kubectl not found: set FLOTILLA_KUBECTL or put kubectl on PATH (e2e/cluster.sh bin)")


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([kubectl_path(), *args], input=stdin, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def get(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    r = kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def items(kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", kind, "-n", namespace, "-o", "json"]
    if selector:
        args += ["-l", selector]
    return json.loads(kubectl(*args).stdout)["items"]


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def gpu_pods_outside(namespace: str) -> list[str]:
    pods = json.loads(kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
            if p["metadata"]["namespace"] != namespace and p["status"].get("phase") in ("Pending", "Running")
            and any("nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"])]


def flotilla_objects_outside(namespace: str) -> list[str]:
    """TrainingJobs and ServingDeployments in other namespaces: an earlier test's, while its namespace goes."""
    out = json.loads(kubectl("get", "trainingjobs,servingdeployments", "-A", "-o", "json").stdout)["items"]
    return [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}" for o in out
            if o["metadata"]["namespace"] != namespace]


def wait_for_gpus_free_outside(namespace: str, timeout: float = 120) -> None:
    """For tests that need the whole cluster: wait until earlier tests' GPU pods, and the jobs and serving
    deployments that would claim GPUs again, are gone."""
    wait_for("no GPU pods or Flotilla objects left by earlier tests",
             lambda: not gpu_pods_outside(namespace) and not flotilla_objects_outside(namespace), timeout=timeout)


def apply(manifest: str, namespace: str) -> subprocess.CompletedProcess:
    return kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest, check=False)


IDLE_WORKER = {"spec": {"containers": [{"name": "w", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"]}]}}


def training_job(name: str, **spec: Any) -> str:
    """A TrainingJob manifest (JSON) with `spec`; its pods idle (KWOK runs nothing; on kind they sleep)."""
    return json.dumps({"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
                       "spec": {"template": IDLE_WORKER, **spec}})


class FlotillaProcess:
    """A `flotilla` subcommand as a child process, its log in a file."""

    def __init__(self, log_path: Path, *args: str, env: dict[str, str] | None = None):
        self.log_path = log_path
        self.args = args
        self.env = env or {}  # on top of this process's environment
        self.proc: subprocess.Popen | None = None

    def start(self) -> "FlotillaProcess":
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "flotilla.cli", *self.args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc:
            stop_process(self.proc, sig)
        self._log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@contextmanager
def controller_api(log_dir: Path, state: Path, *extra: str, more_tokens: str = "") -> Iterator[Any]:
    """`flotilla controller` on a free port (SQLite in `state`), yielding an admin API client.
    `more_tokens`: further lines of the tokens file ('<token>,<role>,<name>')."""
    import httpx

    admin = secrets.token_hex(16)
    (state / "tokens").write_text(f"{admin},admin,e2e\n{more_tokens}")
    port = free_port()
    proc = FlotillaProcess(log_dir / f"controller-{state.name}.log", "controller", "--db-url",
                           f"sqlite:///{state}/c.db", "--tokens-file", str(state / "tokens"), "--port", str(port),
                           *extra).start()
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {admin}"},
                       timeout=10)

    def ready() -> bool:
        try:
            return api.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for("controller ready", ready, timeout=60)
        yield api
    finally:
        api.close()
        proc.stop()


def OperatorProcess(log_path: Path, *extra: str, env: dict[str, str] | None = None) -> FlotillaProcess:
    """No liveness endpoint, and no metrics unless `extra` asks for them on a port of its own (tests run
    several operators side by side)."""
    metrics = () if any(a.startswith("--metrics-port") for a in extra) else ("--metrics-port", "0")
    return FlotillaProcess(log_path, "operator", "--liveness", "", "--resync", "2", *metrics, *extra, env=env)


def SimulatedWorkersProcess(log_path: Path, namespace: str, speed: float = 1.0) -> FlotillaProcess:
    return FlotillaProcess(log_path, "simworkers", "--namespace", namespace, "--speed", str(speed),
                           "--interval", "0.5")


class LoadDriver:
    """Pushes one statistics window per second at the current rate to the controller, like a router would."""

    def __init__(self, api, path: str, rate: float = 6.0):
        self.api, self.path, self.rate = api, path, rate
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(1.0):
            body = {"windowSeconds": 10, "requestsPerSecond": self.rate, "meanPromptTokens": 512,
                    "meanOutputTokens": 128, "ttftP90Ms": 150, "tpotP90Ms": 40, "attainment": 0.99,
                    "requests": int(self.rate * 10)}
            self.api.post(self.path, json=body)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def node_bound_token(namespace: str, service_account: str, node: str, audience: str = "flotilla-controller",
                     duration: str = "1h") -> str:
    """A ServiceAccount token bound to a pod scheduled on `node`, as an agent's projected token is: the API
    server's TokenReview then names the node (user.extra["authentication.kubernetes.io/node-name"]). The
    ServiceAccount and the pod (`<sa>-on-<node>`, never started for real on a KWOK node) are made if missing;
    deleting the pod revokes the token."""
    pod = f"{service_account}-on-{node}"[:63].rstrip("-")
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": service_account}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
         "spec": {"nodeName": node, "serviceAccountName": service_account, "automountServiceAccountToken": False,
                  "tolerations": [{"operator": "Exists"}],
                  "containers": [{"name": "agent", "image": "e2e.invalid/agent"}]}}]})
    kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
    return kubectl("create", "token", service_account, "-n", namespace, "--bound-object-kind", "Pod",
                   "--bound-object-name", pod, "--audience", audience, f"--duration={duration}").stdout.strip()
