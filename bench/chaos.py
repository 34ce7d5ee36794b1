"""Benchmark: the chaos suite on a throw-away local control plane, and the harm it counted.

  python bench/chaos.py [--quick] [--case NAME ...] [--port-base N] [--keep-logs DIR]

Starts its own cluster (e2e/cluster.sh up with a state folder, kubeconfig and port base of its own; down at
the end, also on failure or Ctrl-C), applies the CRDs, runs every case of e2e/chaos/controller_cases.py and
e2e/chaos/operator_cases.py (or the ones named with --case) one after the other, and prints a table: case,
ok, seconds, the counters that are not 0, details. Its last line is one JSON object (e2e.chaos.outcome.summary):
{"cases": n, "cases_passed": n, "jobs_lost": 0, "duplicate_pods": 0, "gpus_promised_twice": 0,
 "steps_lost_past_checkpoint": 0, "false_taints": 0, "forged_writes_accepted": 0, "http_5xx": 0}
--quick shortens the cases' observation windows and fuzzing (not the faults): the whole run within 10 minutes.
Exit status 0 only when every case passed and every counter is 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

CASE_MODULES = ("e2e.chaos.controller_cases", "e2e.chaos.operator_cases")


def log(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


class Cluster:
    """e2e/cluster.sh on a state folder, kubeconfig and port base of the bench's own."""

    def __init__(self, state: Path, port_base: int) -> None:
        self.kubeconfig = state.parent / "kubeconfig"
        self.env = {**os.environ, "FLOTILLA_STATE": str(state), "FLOTILLA_KUBECONFIG": str(self.kubeconfig),
                    "FLOTILLA_PORT_BASE": str(port_base)}

    def sh(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(ROOT / "e2e" / "cluster.sh"), *args], env=self.env, capture_output=True,
                                text=True)
        if check and result.returncode != 0:
            raise SystemExit(f"e2e/cluster.sh {' '.join(args)} failed:\n{result.stderr[-2000:]}")
        return result

    def up(self) -> None:
        self.sh("up")
        bin_dir = self.sh("bin").stdout.strip().splitlines()[-1]
        # The cases use e2e.kube.kubectl and the kubernetes client (KUBECONFIG, PATH), and e2e/cluster.sh to
        # stop and start components (FLOTILLA_*): all of them must find this cluster.
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("FLOTILLA_")})
        os.environ["KUBECONFIG"] = str(self.kubeconfig)
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
        kubectl = [str(Path(bin_dir) / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
                       check=True, capture_output=True)
        subprocess.run([*kubectl, "wait", "--for", "condition=established", "--timeout=60s",
                        "crd/trainingjobs.flotilla.dev", "crd/servingdeployments.flotilla.dev"],
                       check=True, capture_output=True)

    def down(self) -> None:
        self.sh("down", check=False)


def load_cases() -> dict[str, Callable]:
    cases: dict[str, Callable] = {}
    for name in CASE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            log(f"{name} is not there: its cases are skipped")
            continue
        for case, fn in module.CASES.items():
            if case in cases:
                raise SystemExit(f"case {case!r} is defined twice")
            cases[case] = fn
    return cases


def table(outcomes: list) -> str:
    from e2e.chaos.outcome import COUNTERS

    rows = [("case", "ok", "seconds", "harm", "details")]
    for o in outcomes:
        harm = ", ".join(f"{c}={getattr(o, c)}" for c in COUNTERS if getattr(o, c)) or "-"
        rows.append((o.case, "yes" if o.ok() else "NO", f"{o.seconds:.0f}", harm, o.details))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths)) + "  " + r[4] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="shorter observation windows and fewer fuzz examples (the faults keep their length)")
    parser.add_argument("--case", action="append", default=[], metavar="NAME", help="run only this case (repeatable)")
    parser.add_argument("--port-base", type=int, default=24440,
                        help="FLOTILLA_PORT_BASE of the throw-away cluster (default %(default)s)")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR",
                        help="write the cases' logs here (default: a temporary folder, removed at the end)")
    args = parser.parse_args()
    if args.quick:
        os.environ["FLOTILLA_CHAOS_QUICK"] = "1"   # read by the case modules when they are imported

    cases = load_cases()
    unknown = [c for c in args.case if c not in cases]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(cases)}")
    chosen = {name: fn for name, fn in cases.items() if not args.case or name in args.case}

    from e2e.chaos.outcome import Outcome, summary

    work = Path(tempfile.mkdtemp(prefix="flotilla-chaos-"))
    logs = args.keep_logs or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(work / "cluster", args.port_base)
    outcomes: list[Outcome] = []
    began = time.monotonic()
    try:
        log(f"starting a throw-away cluster (port base {args.port_base}, state {work})")
        cluster.up()
        log(f"cluster up in {time.monotonic() - began:.0f} s; {len(chosen)} cases, logs in {logs}")
        for name, case in chosen.items():
            log(f"case {name} ...")
            try:
                outcome = case(logs)
            except Exception as e:  # a case must return its Outcome; one that raises still counts, as failed
                outcome = Outcome(name, details=f"the case raised {type(e).__name__}: {e}")
            outcomes.append(outcome)
            log(f"case {name}: {'ok' if outcome.ok() else 'FAILED'} in {outcome.seconds:.0f} s")
    finally:
        log("taking the cluster down")
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)   # the cluster's state; logs too unless --keep-logs put them elsewhere
    print(table(outcomes))
    print(f"total {time.monotonic() - began:.0f} s")
    figures = summary(outcomes)
    print(json.dumps(figures))
    return 0 if figures["cases_passed"] == figures["cases"] and all(
        v == 0 for k, v in figures.items() if k not in ("cases", "cases_passed")) else 1


if __name__ == "__main__":
    sys.exit(main())
