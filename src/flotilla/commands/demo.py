"""Run Flotilla on its embedded defaults, on this machine.

Brings up the local control plane (e2e/cluster.sh: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK with fake 8-GPU nodes), applies
the CRDs, starts the operator and the simulated workers (`flotilla simworkers`:
no container runs on a fake node, so they play rank 0 of each job, with time
running --speed times faster), applies examples/ (two TrainingJobs with
deadlines and one ServingDeployment) and shows `kubectl get flotilla` as it
changes, until the training jobs finish. The cluster is left running for you
to explore (export KUBECONFIG=.flotilla/kubeconfig); `e2e/cluster.sh down` stops it.
Run from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HELP = "Bring up a local cluster with fake GPU nodes, run the operator and apply examples/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="repository checkout (default: .)")
    parser.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default: %(default)s)")
    parser.add_argument("--speed", type=float, default=100, help="simulated time runs this many times faster")
    parser.add_argument("--timeout", type=float, default=300, help="stop watching after this many seconds")
    parser.add_argument("--down", action="store_true", help="stop the cluster at the end")


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

    def k(*a: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([kubectl, *a], env=env, text=True, **kw)

    k("apply", "--server-side", "-f", str(repo / "crds"), check=True)
    k("wait", "--for", "condition=established", "--timeout=60s",
      "crd/trainingjobs.flotilla.dev", "crd/servingdeployments.flotilla.dev", check=True)
    procs = {}
    for name, argv in (("operator", ["operator", "--liveness", ""]),
                       ("simworkers", ["simworkers", "--speed", str(args.speed)])):
        log_path = repo / ".flotilla" / f"{name}.log"
        with open(log_path, "w") as log:
            procs[name] = subprocess.Popen([sys.executable, "-m", "flotilla.cli", *argv],
                                           stdout=log, stderr=subprocess.STDOUT, env=env)
        print(f"{name} started (pid {procs[name].pid}), log: {log_path}")
    try:
        k("apply", "-f", str(repo / "examples"), check=True)
        last, started = "", time.monotonic()
        while time.monotonic() - started < args.timeout:
            table = k("get", "flotilla", capture_output=True).stdout
            if table != last:
                print(f"\n--- kubectl get flotilla  (t={time.monotonic() - started:.0f}s)\n{table}", flush=True)
                last = table
            phases = k("get", "tj", "-o", "jsonpath={.items[*].status.phase}", capture_output=True).stdout.split()
            if phases and all(p in ("Succeeded", "Failed", "Rejected") for p in phases):
                break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    print(f"error: {name} exited; see .flotilla/{name}.log", file=sys.stderr)
                    return 1
            time.sleep(2)
        print("\nEvents:")
        k("get", "events", "--sort-by=.lastTimestamp",
          "--field-selector", "involvedObject.apiVersion=flotilla.dev/v1alpha1")
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
