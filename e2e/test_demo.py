"""The README's quick start as a new user follows it, in order, on a throw-away cluster of its own:

1. `make demo`: the scenario reaches each step (a refusal with its reason; a GPU fault, that GPU out of service, its job
   moved with 0 steps lost; serving's load tripled, its P:D ratio changed, GPUs lent by training through a
   checkpoint and given back), then Flotilla keeps running;
2. the console: a browser signs in with the printed token and sees the jobs, the serving deployment and the fault;
3. a job of one's own: the README's commands, as written, against the demo's cluster;
4. `make down`: the demo and everything it started stop, the cluster too.

`make demo` runs here with its venv step taken as done (`make -o .venv/.installed-demo`: this test runs in the
venv already) and DEMO_ARGS for a state folder and a port of its own (FLOTILLA_DEMO_TEST_PORT_BASE moves its
cluster's ports)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from e2e.kube import ROOT
from e2e.test_quickstart import quickstart_blocks
from flotilla.testing import browser
from flotilla.testing.services import free_port, stop_process

PORT_BASE = int(os.environ.get("FLOTILLA_DEMO_TEST_PORT_BASE", "17540"))  # the test cluster is at 17440


def _ratios(line: str) -> list[Fraction]:
    """The P:D ratios a line names, reduced (2:2 is 1:1's proportion)."""
    found = re.search(r"P:D (\d+):(\d+)(?: -> (\d+):(\d+))?", line)
    assert found, line
    n = [int(g) for g in found.groups() if g is not None]
    return [Fraction(p, d) for p, d in zip(n[::2], n[1::2])]


def _lines(proc: subprocess.Popen, into: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line.rstrip("\n"))


def _wait_line(lines: list[str], text: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next((line for line in lines if text in line), None)
        if found is not None:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"the demo never printed {text!r}; its output:\n" + "\n".join(lines[-40:]))


@pytest.mark.timeout(900)  # a cluster of its own, the scenario, the console, the quick start's commands
@pytest.mark.skipif(browser.available() is not None, reason=f"the browser check needs {browser.available()}")
def test_the_quickstart_in_order_make_demo_the_console_a_job_of_your_own_make_down(tmp_path: Path):
    state, port = tmp_path / "demo", free_port()
    demo_args = f"DEMO_ARGS=--state {state} --port {port}"
    env = {**os.environ, "FLOTILLA_STATE": str(tmp_path / "cluster"), "FLOTILLA_PORT_BASE": str(PORT_BASE),
           "PYTHONUNBUFFERED": "1"}
    for name in ("KUBECONFIG", "FLOTILLA_KUBECONFIG", "MAKEFLAGS"):
        env.pop(name, None)
    first = quickstart_blocks()[0].splitlines()[0]
    assert first.startswith("make demo ")
    proc = subprocess.Popen(["make", "-o", ".venv/.installed-demo", "demo", demo_args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=_lines, args=(proc, lines), daemon=True).start()
    try:
        # 1. make demo
        _wait_line(lines, "console: http://127.0.0.1", proc, timeout=240)
        refused = _wait_line(lines, "too-late: Rejected", proc, timeout=120)
        assert "deadline" in refused or "needs" in refused, refused  # the reason, not just the verdict
        tainted = _wait_line(lines, "out of service (", proc, timeout=300)
        moved = _wait_line(lines, "through its checkpoint at step", proc, timeout=180)
        assert moved.endswith(": 0 steps lost"), moved
        _wait_line(lines, "returned to service", proc, timeout=60)
        replan = _wait_line(lines, "the planner re-plans: P:D", proc, timeout=300)
        before, after = _ratios(replan)
        assert before != after, replan  # the ratio moved, not only the scale
        lends = _wait_line(lines, " GPU(s) to assistant: it checkpointed at step", proc, timeout=180)
        assert lends.endswith("(0 steps lost)"), lends
        lender = lends.split()[1]
        borrowed = _wait_line(lines, "assistant serves at P:D", proc, timeout=180)
        assert borrowed.endswith(f"borrowed from {lender}") and _ratios(borrowed) == [after], borrowed
        back = _wait_line(lines, "got its GPUs back through a checkpoint", proc, timeout=240)
        assert f"; {lender} got its GPUs back" in back and _ratios(back) == [before], back
        _wait_line(lines, "Flotilla keeps running", proc, timeout=60)
        node = tainted.split()[1]
        assert f"pretrain runs on {node}" in _wait_line(lines, "pretrain runs on", proc, timeout=1)
        sick = tainted.split()[3]  # "[demo]   <node> GPU <index> out of service (<why>) ..."
        kept = re.search(rf"{node} \(GPUs ([\d, ]+)\)", moved.split(" through ")[0])
        assert kept is None or sick not in kept[1].split(", "), moved  # off the sick GPU: another node, or the same
        # node's other GPUs (one GPU out costs one GPU)
        started = [int(line.split()[1]) for line in (state / "demo.pids").read_text().splitlines()]
        assert len(started) >= 1 + 3 + 1  # the demo, operator, controller, simworkers and an agent per node

        # 2. The console, after the scenario.
        read_token = next(line.split(",")[0] for line in (state / "console-tokens").read_text().splitlines()
                          if line.endswith(",read,demo-viewer"))
        assert f"read token: {read_token}" in _wait_line(lines, "console: http://127.0.0.1", proc, timeout=1)
        base = f"http://127.0.0.1:{port}"
        with browser.chromium() as d:
            browser.sign_in(d, base, read_token)
            d.get(f"{base}/ui/#/training")
            shown = browser.wait(d, lambda d: {r.get_attribute("data-job"): r.get_attribute("data-phase") for r in
                                               d.find_elements("css selector", "tr[data-job]")}
                                 if len(d.find_elements("css selector", "tr[data-job]")) >= 5 else None,
                                 "the demo's jobs in the console", timeout=30)
            d.get(f"{base}/ui/#/serving")
            browser.wait(d, lambda d: d.find_elements("css selector", 'tr[data-serving="default/assistant"]'),
                         "the serving deployment in the console", timeout=30)
            d.get(f"{base}/ui/#/nodes/{node}")
            evidence = browser.wait(d, lambda d: d.find_elements("css selector", ".card.evidence"),
                                    f"the detector's evidence on {node}", timeout=30)
            fault = " ".join(card.text for card in evidence)
        assert shown.get("default/too-late") == "Rejected", shown
        assert {"default/pretrain", f"default/{lender}"} <= set(shown), shown
        assert "ecc" in fault.lower() or "xid" in fault.lower(), fault  # the simulated GPU fault: ECC, XID 94

        # 3. A job of your own: the README's commands as written, the demo's kubeconfig where it says $PWD/.flotilla.
        block = quickstart_blocks()[1]
        assert "$PWD/.flotilla/kubeconfig" in block
        script = "set -euo pipefail\n" + block.replace("$PWD/.flotilla/", f"{state}/")
        out = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert re.search(r"trainingjob\.flotilla\.dev/resnet50\s", out.stdout), out.stdout
        assert re.search(r"servingdeployment\.flotilla\.dev/assistant\s", out.stdout), out.stdout  # get flotilla
        assert "Events:" in out.stdout  # kubectl describe tj resnet50

        # 4. make down: the demo (it was still up) and all it started stop, then the cluster.
        down = subprocess.run(["make", "down", demo_args], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert proc.wait(timeout=60) == 0, "\n".join(lines[-40:])
        assert "Flotilla stopped" in lines[-1] or any("Flotilla stopped" in line for line in lines[-5:]), lines[-5:]
        assert not (state / "demo.pids").exists()
        left = [pid for pid in started if Path(f"/proc/{pid}").exists()]
        assert not left, f"processes the demo started outlived it: {left}"
        gone = subprocess.run(["bash", "-c", f"$(e2e/cluster.sh bin)/kubectl --kubeconfig {state}/kubeconfig "
                               "--request-timeout=5s get nodes"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert gone.returncode != 0, "make down left the cluster up"
    finally:
        stop_process(proc, group=True)
        if state.is_dir():  # what the user would have seen, for a failure's post-mortem
            (state / "demo-output.txt").write_text("\n".join(lines) + "\n")
        # Whatever a demo that did not finish left behind (its pids file), then the cluster.
        subprocess.run([sys.executable, "-m", "flotilla.cli", "demo", "--repo", str(ROOT), "--state", str(state),
                        "--stop"], env=env, check=False, capture_output=True, timeout=120)
