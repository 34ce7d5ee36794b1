"""Run Flotilla on its embedded defaults, on this machine, and show what it is for.

Brings up the local control plane (e2e/cluster.sh: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK with fake 8-GPU nodes), applies the CRDs, starts the operator, the controller (its
console at http://127.0.0.1:PORT/ui/, printed with a read token), one simulated node agent per node and the
simulated workers (`flotilla simworkers`: no container runs on a fake node, so they play rank 0 of each job,
with time running --speed times faster), and applies examples/.

Then it plays a short scenario (unless --no-scenario), each step announced in one line and visible in the
console as it happens: a job whose deadline cannot be met is refused with the reason; a GPU fault on a node
that runs a job, the node tainted and the job moved off it through a checkpoint, no step lost; a serving
deployment on engine doubles whose load triples, so that its P:D ratio changes and it borrows GPUs from a
training job through a checkpoint, and gives them back when the load falls (flotilla.commands.demo_serving).
After that
Flotilla keeps running, with a live view of jobs, nodes and events, until Ctrl-C (or --timeout seconds).
`flotilla demo --stop` (`make down`) stops everything the demo started, the cluster included.
Run from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from flotilla.testing.serving_pods import ServingKubelet

HELP = "Bring up a local cluster with fake GPU nodes, run Flotilla on examples/ and play its scenario"
FINISHED = ("Succeeded", "Failed", "Rejected")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="repository checkout (default: .)")
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default: %(default)s)")
    parser.add_argument("--speed", type=float, default=100, help="simulated time runs this many times faster")
    parser.add_argument("--port", type=int, default=8080, help="the controller's port: API and console (default 8080)")
    parser.add_argument("--no-scenario", action="store_true", help="apply examples/ and stay up; play no scenario")
    parser.add_argument("--timeout", type=float,
                        help="after the scenario, stay up this many seconds, then stop (default: until Ctrl-C)")
    parser.add_argument("--down", action="store_true", help="also stop the cluster at the end")
    parser.add_argument("--state", type=Path,
                        help="the demo's own files: tokens, logs, the controller's database (default: REPO/.flotilla)")
    parser.add_argument("--stop", action="store_true",
                        help="stop what an earlier `flotilla demo` left running (its processes, then the cluster)")


def console_tokens(path: Path) -> tuple[str, str]:
    """-> (read token, admin token) from the demo's tokens file, made (owner-only) with one of each, and an
    ingest token for the demo's node agents, if missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# <token>,<role: read|ingest|admin>,<name>  (made by flotilla demo)\n"
                    f"{secrets.token_urlsafe(24)},read,demo-viewer\n{secrets.token_urlsafe(24)},admin,demo-admin\n"
                    f"{secrets.token_urlsafe(24)},ingest,demo-agents\n")
    found = _tokens(path)
    if "read" not in found or "admin" not in found:
        raise SystemExit(f"error: {path} needs a read and an admin token (delete it to make new ones)")
    return found["read"], found["admin"]


def _tokens(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split("#", 1)[0].split(",")]
        if len(parts) == 3:
            found.setdefault(parts[1], parts[0])
    return found


def ingest_token(path: Path) -> str:
    """The tokens file's ingest token, added if a file made by an older demo has none."""
    found = _tokens(path)
    if "ingest" not in found:
        found["ingest"] = secrets.token_urlsafe(24)
        with open(path, "a") as f:
            f.write(f"{found['ingest']},ingest,demo-agents\n")
    return found["ingest"]


class Demo:
    """The cluster, the processes the demo started (each leading its own process group) and its files."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.repo: Path = args.repo.resolve()
        self.state: Path = (args.state or self.repo / ".flotilla").resolve()
        self.state.mkdir(parents=True, exist_ok=True)
        self.cluster = self.repo / "e2e" / "cluster.sh"
        self.kubeconfig = os.environ.get("FLOTILLA_KUBECONFIG") or str(self.state / "kubeconfig")
        self.env = {**os.environ, "FLOTILLA_NODES": str(args.nodes), "KUBECONFIG": self.kubeconfig,
                    "FLOTILLA_KUBECONFIG": self.kubeconfig}
        self.pids = self.state / "demo.pids"
        self.port = args.port
        self.url = f"http://127.0.0.1:{args.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.kubelet: ServingKubelet | None = None  # the serving step's engine doubles, once it has started them
        self._pids_lock = threading.Lock()
        self.kubectl = ""

    def up(self) -> None:
        subprocess.run([str(self.cluster), "up"], check=True, env=self.env)
        bin_dir = subprocess.run([str(self.cluster), "bin"], check=True, env=self.env, capture_output=True,
                                 text=True).stdout.strip().splitlines()[-1]
        self.kubectl = str(Path(bin_dir) / "kubectl")

    def k(self, *a: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run([self.kubectl, *a], env=self.env, text=True, check=check, **kw)

    def get(self, *a: str) -> dict:
        out = self.k("get", *a, "-o", "json", check=False, capture_output=True)
        return json.loads(out.stdout) if out.returncode == 0 and out.stdout else {}

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        log_path = self.state / f"{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "flotilla.cli", *argv], stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs[name] = proc
        self._write_pids()
        return proc

    def stop_one(self, name: str) -> None:
        proc = self.procs.pop(name)
        _stop_groups([proc.pid], {proc.pid: proc})
        proc.wait()
        self._write_pids()

    def stop_all(self) -> None:
        """All at once: each may take seconds to shut down cleanly (the operator gives up its writes)."""
        if self.kubelet is not None:
            self.kubelet.stop()
        _stop_groups([p.pid for p in self.procs.values()], {p.pid: p for p in self.procs.values()})
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()
        self.pids.unlink(missing_ok=True)

    def _write_pids(self) -> None:
        """Every process it started, so that `--stop` finds them if this process was killed."""
        with self._pids_lock:
            engines = {f"engine-{e.pod}": e.proc for e in (self.kubelet.engines.values() if self.kubelet else [])}
            self.pids.write_text(f"demo {os.getpid()}\n" + "".join(
                f"{name} {p.pid}\n" for name, p in {**self.procs, **engines}.items()))

    def record_engines(self) -> None:
        self._write_pids()

    def dead(self) -> str | None:
        return next((name for name, p in self.procs.items() if p.poll() is not None), None)


def _stop_groups(pgids: list[int], children: Mapping[int, subprocess.Popen] | None = None,
                 timeout: float = 20.0) -> None:
    """SIGTERM to each process group, SIGKILL to what is left of them after `timeout` s. `children`: the
    leaders that are our own children, reaped here (an exited child not yet reaped still counts as alive)."""
    children = children or {}

    def signal_all(sig: int, among: list[int]) -> list[int]:
        alive = []
        for pgid in among:
            if pgid in children and children[pgid].poll() is not None and sig == 0:
                continue
            try:
                os.killpg(pgid, sig)
                alive.append(pgid)
            except ProcessLookupError:
                pass
        return alive

    left = signal_all(signal.SIGTERM, pgids)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = signal_all(0, left)
    signal_all(signal.SIGKILL, pgids)  # the leaders' children too, if any outlived them


def stop_left_running(demo: Demo) -> int:
    """`flotilla demo --stop` (`make down`): the demo itself if it still runs (it stops what it started, as on
    Ctrl-C), then whatever process group it recorded is left (a demo that was killed), then the cluster."""
    if demo.pids.exists():
        recorded = [(name, int(pid)) for name, _, pid in
                    (line.partition(" ") for line in demo.pids.read_text().splitlines()) if pid.isdigit()]
        leader = next((pid for name, pid in recorded if name == "demo"), None)
        if leader is not None and _ours(leader):
            print(f"stopping the demo (pid {leader}) and what it started", flush=True)
            os.kill(leader, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _ours(leader) and time.monotonic() < deadline:
                time.sleep(0.2)
        for name, pid in recorded:
            if name != "demo" and _ours(pid):
                print(f"stopping {name} (pid {pid})", flush=True)
                _stop_groups([pid])
        if leader is not None and _ours(leader):
            os.kill(leader, signal.SIGKILL)
        demo.pids.unlink(missing_ok=True)
    subprocess.run([str(demo.cluster), "down"], env=demo.env, check=False)
    return 0


def _ours(pid: int) -> bool:
    """Still a process of ours (a recycled pid would run something else)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        # `-m flotilla.cli ...`, the `flotilla` console script (`make demo`), an engine double
        return any(a in (b"flotilla.cli", b"flotilla.testing.engine.server") or a.endswith(b"/flotilla") for a in args)
    except OSError:
        return False


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float, demo: Demo) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (name := demo.dead()) is not None:
            raise RuntimeError(f"{name} exited; see {demo.state / (name + '.log')}")
        if (value := check()):
            return value
        time.sleep(1)
    raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")


def run(args: argparse.Namespace) -> int:
    demo = Demo(args)
    if not demo.cluster.exists():
        raise SystemExit(f"{demo.cluster} not found; run from the repository root or pass --repo")
    if args.stop:
        return stop_left_running(demo)
    if demo.pids.exists() and any(_ours(int(p)) for _, _, p in
                                  (line.partition(" ") for line in demo.pids.read_text().splitlines()) if p.isdigit()):
        raise SystemExit("a demo is already running (see .flotilla/demo.pids); `make down` stops it")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the story
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does: what it started is stopped too
    demo.up()
    demo.k("apply", "--server-side", "-f", str(demo.repo / "crds"))
    demo.k("wait", "--for", "condition=established", "--timeout=60s", "crd/trainingjobs.flotilla.dev",
           "crd/servingdeployments.flotilla.dev")
    tokens = demo.state / "console-tokens"
    read_token, admin_token = console_tokens(tokens)
    agent_token = demo.state / "agent-token"
    agent_token.write_text(ingest_token(tokens))
    agent_token.chmod(0o600)
    from flotilla.commands.demo_serving import CONTROLLER_ARGS, POOL_POLICY

    pool_policy = demo.state / "pool-policy.yaml"
    pool_policy.write_text(POOL_POLICY)
    try:
        demo.start("operator", "operator", "--liveness", "", "--metrics-port", "0", "--pool-policy", str(pool_policy))
        demo.start("controller", "controller", "--db-url", f"sqlite:///{demo.state / 'controller.db'}",
                   "--tokens-file", str(tokens), "--port", str(args.port), *CONTROLLER_ARGS)
        demo.start("simworkers", "simworkers", "--speed", str(args.speed))
        nodes = sorted(n["metadata"]["name"] for n in demo.get("nodes").get("items", []))
        for node in nodes:
            start_agent(demo, node, agent_token)
        say(f"Flotilla is up: operator, controller, {len(nodes)} node agents, simulated workers "
            f"(logs in {demo.state}/)")
        say(f"console: {demo.url}/ui/  read token: {read_token}  (an admin token, which can act, is in {tokens})")
        demo.k("apply", "-f", str(demo.repo / "examples"))
        say("applied examples/: two TrainingJobs with deadlines and a ServingDeployment")
        if not args.no_scenario:
            from flotilla.commands.demo_scenario import play

            play(demo, agent_token, admin_token, start_agent)
        say(f"Flotilla keeps running. Apply a job of your own: KUBECONFIG={demo.kubeconfig} "
            f"$(e2e/cluster.sh bin)/kubectl apply -f examples/trainingjob-resnet.yaml; see it in the console. "
            "Ctrl-C stops Flotilla; `make down` stops everything, the cluster too.")
        from flotilla.commands.demo_view import live

        live(demo, args.timeout)
    except KeyboardInterrupt:
        pass
    except (TimeoutError, RuntimeError) as e:
        print(f"[demo] error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        demo.stop_all()
        if args.down:
            subprocess.run([str(demo.cluster), "down"], env=demo.env)
        else:
            say(f"Flotilla stopped; the cluster is still up (KUBECONFIG={demo.kubeconfig}); `make down` stops it.")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def start_agent(demo: Demo, node: str, token_file: Path, *extra: str) -> None:
    demo.start(f"agent-{node}", "agent", "--node", node, "--source", "sim", "--controller-url", demo.url,
               "--token-file", str(token_file), "--step-port", "0", *extra)
