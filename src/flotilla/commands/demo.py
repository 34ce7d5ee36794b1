"""Run Flotilla on its embedded defaults, on this machine.

Brings up the local control plane (e2e/cluster.sh: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK with fake 8-GPU nodes), applies
the CRDs, starts the operator, the controller (its console at
http://127.0.0.1:PORT/ui/, printed with a read token) and the simulated workers
(`flotilla simworkers`: no container runs on a fake node, so they play rank 0 of
each job, with time running --speed times faster), applies examples/ (two
TrainingJobs with deadlines and one ServingDeployment) and shows `kubectl get
flotilla` as it changes, until the training jobs finish (with --stay, until Ctrl-C). The cluster is left running for you
to explore (export KUBECONFIG=.flotilla/kubeconfig); `e2e/cluster.sh down` stops it.
Run from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HELP = "Bring up a local cluster with fake GPU nodes, run the operator and apply examples/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="repository checkout (default: .)")
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default: %(default)s)")
    parser.add_argument("--speed", type=float, default=100, help="simulated time runs this many times faster")
    parser.add_argument("--timeout", type=float, default=300, help="stop watching after this many seconds")
    parser.add_argument("--down", action="store_true", help="stop the cluster at the end")
    parser.add_argument("--port", type=int, default=8080, help="the controller's port: API and console (default 8080)")
    parser.add_argument("--stay", action="store_true",
                        help="keep the operator, controller and workers running after the jobs finish, until Ctrl-C")


def console_tokens(path: Path) -> tuple[str, str]:
    """-> (read token, admin token) from the demo's tokens file, made (owner-only) with one of each if missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# <token>,<role: read|ingest|admin>,<name>  (made by flotilla demo)\n"
                    f"{secrets.token_urlsafe(24)},read,demo-viewer\n{secrets.token_urlsafe(24)},admin,demo-admin\n")
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split("#", 1)[0].split(",")]
        if len(parts) == 3:
            found.setdefault(parts[1], parts[0])
    if "read" not in found or "admin" not in found:
        raise SystemExit(f"error: {path} needs a read and an admin token (delete it to make new ones)")
    return found["read"], found["admin"]


def run(args: argparse.Namespace) -> int:
    repo = args.repo.resolve()
    cluster = repo / "e2e" / "cluster.sh"
    if not cluster.exists():
        print(f"error: {cluster} not found; run from the repository root or pass --repo", file=sys.stderr)
        return 2
    env = {**os.environ, "FLOTILLA_NODES": str(args.nodes), "KUBECONFIG": str(repo / ".flotilla" / "kubeconfig")}
    subprocess.run([str(cluster), "up"], check=True, env=env)
    kubectl = str(Path(subprocess.run([str(cluster), "bin"], check=True, env=env, capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]) / "kubectl")

    def k(*a: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, *a], env=env, text=True, **kw)

    k("apply", "--server-side", "-f", str(repo / "crds"), check=True)
    k("wait", "--for", "condition=established", "--timeout=60s",
      "crd/trainingjobs.flotilla.dev", "crd/servingdeployments.flotilla.dev", check=True)
    procs = {}
    tokens = repo / ".flotilla" / "console-tokens"
    read_token, _ = console_tokens(tokens)
    controller = ["controller", "--db-url", f"sqlite:///{repo / '.flotilla' / 'controller.db'}",
                  "--tokens-file", str(tokens), "--port", str(args.port)]
    for name, argv in (("operator", ["operator", "--liveness", ""]), ("controller", controller),
                       ("simworkers", ["simworkers", "--speed", str(args.speed)])):
        log_path = repo / ".flotilla" / f"{name}.log"
        with open(log_path, "w") as log:
            procs[name] = subprocess.Popen([sys.executable, "-m", "flotilla.cli", *argv],
                                           stdout=log, stderr=subprocess.STDOUT, env=env)
        print(f"{name} started (pid {procs[name].pid}), log: {log_path}")
    print(f"\nConsole: http://127.0.0.1:{args.port}/ui/\n  read token: {read_token}\n"
          f"  (an admin token, which can act, is in {tokens})\n", flush=True)
    try:
        k("apply", "-f", str(repo / "examples"), check=True)
        last, started = "", time.monotonic()
        while args.stay or time.monotonic() - started < args.timeout:
            table = k("get", "flotilla", capture_output=True).stdout
            if table != last:
                print(f"\n--- kubectl get flotilla  (t={time.monotonic() - started:.0f}s)\n{table}", flush=True)
                last = table
            phases = k("get", "tj", "-o", "jsonpath={.items[*].status.phase}", capture_output=True).stdout.split()
            if phases and all(p in ("Succeeded", "Failed", "Rejected") for p in phases) and not args.stay:
                break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    print(f"error: {name} exited; see .flotilla/{name}.log", file=sys.stderr)
                    return 1
            time.sleep(2)
        print("\nEvents:")
        k("get", "events", "--sort-by=.lastTimestamp",
          "--field-selector", "involvedObject.apiVersion=flotilla.dev/v1alpha1")
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=20)
        if args.down:
            subprocess.run([str(cluster), "down"], env=env)
        else:
            print(f"\nThe cluster is still up: export KUBECONFIG={env['KUBECONFIG']}; "
                  f"`e2e/cluster.sh down` stops it.")
    return 0
