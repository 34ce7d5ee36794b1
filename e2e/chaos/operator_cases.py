"""Chaos cases aimed at the operator and the control plane it talks to.

Each case runs against the cluster in KUBECONFIG (e2e/cluster.sh; the cases that restart
kube-apiserver or etcd use `e2e/cluster.sh kill|start COMPONENT` with the same FLOTILLA_STATE),
starts its own operator(s) and simulated workers in a namespace of its own, injects one fault,
waits on conditions, and returns an Outcome (e2e/chaos/outcome.py) with the harm counted by a
HarmSampler (e2e/chaos/watch.py) and its own checks in `passed` and `details`.

* operator-kill-<step>: SIGKILL the operator at one step of a reshard (failpoints,
  src/flotilla/operator/failpoints.py), restart it: the job finishes with all its steps, one reshard.
* apiserver-restart, etcd-restart: SIGKILL one, start it again ~10 s later: passes resume, nothing moves.
* watch-gap-deletions: kube-apiserver down; as soon as it is back a worker pod and an empty node are
  deleted, while the operator's watches still back off: the pod comes back within the re-list period,
  and a job that only fits with the deleted node is not placed on it.
* leader-sigstop: two operators with --leader-elect; the leader is SIGSTOPped past its Lease, the
  standby takes over and moves a job; the old one, SIGCONTed, writes nothing and steps down (exit 1).
* job-name-reuse: a job finishes, is deleted with --cascade=orphan, a new job of the same name (twice
  the steps) runs from nothing on pods of its own.
* operator-kill-mid-reclaim: two queues of half the cluster each; team A's job borrows team B's idle half; team
  B submits a job; the operator is SIGKILLed right after asking the borrower for the reclaim's checkpoint, and
  restarted: the borrower gives the GPUs back through that checkpoint (no step lost, nothing promised twice), and
  B's job runs on its share.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from e2e.chaos.outcome import Outcome
from e2e.chaos.watch import HarmSampler, owner_uid
from flotilla.reshard.view import worker_set_of
from e2e.kube import (
    ROOT,
    FlotillaProcess,
    OperatorProcess,
    SimulatedWorkersProcess,
    apply,
    get,
    items,
    kubectl,
    wait_for,
    wait_for_gpus_free_outside,
)
from flotilla.operator.failpoints import ENV as FAILPOINTS_ENV
from flotilla.operator.failpoints import SIGNAL_ENV as FAILPOINT_SIGNAL_ENV

CLUSTER_SH = ROOT / "e2e" / "cluster.sh"
SIM_SPEED = 2.0  # 2 GPUs: 36 steps/s
# bench/chaos.py --quick: the jobs that only need to get through a reshard are shorter; the faults are not.
QUICK = os.environ.get("FLOTILLA_CHAOS_QUICK") == "1"
MOVER_STEPS = 300 if QUICK else 600
RELIST_SECONDS = 10
API_TIMEOUT_SECONDS = 5
LEASE_SECONDS = 6
# The fixed operator's flags; a build that lacks one runs without it (said in the details), so that the
# suite still runs, and fails for the defect rather than for a usage error.
OPERATOR_FLAGS = (("--api-timeout", str(API_TIMEOUT_SECONDS)), ("--relist-seconds", str(RELIST_SECONDS)))


class CaseFailed(AssertionError):
    pass


class JobStuck(CaseFailed):
    """A job that does not get on: it counts as lost (unlike a failed check on a job that would finish)."""


def check(ok: Any, message: str) -> None:
    if not ok:
        raise CaseFailed(message)


# --- the control plane ------------------------------------------------------------------------------
def cluster(*args: str, timeout: float = 180) -> None:
    """e2e/cluster.sh with this process's FLOTILLA_* settings (the cluster the tests run on)."""
    r = subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"e2e/cluster.sh {' '.join(args)} failed: {r.stderr.strip()[-800:]}")


def audit_log() -> Path:
    state = Path(os.environ.get("FLOTILLA_STATE") or ROOT / ".flotilla" / "cluster")
    return state / "logs" / "audit.log"


def restore_nodes() -> None:
    """Re-create deleted KWOK nodes and wait until they are Ready."""
    cluster("nodes", os.environ.get("FLOTILLA_NODES", "4"))



def restart_clients(run: "Run") -> None:
    """After an API server outage, restart the control plane's own clients (kube-controller-manager,
    kube-scheduler, KWOK): their watches would back off for up to a minute, and the scheduler exits on a
    cache it finds corrupted. The operator under test is left to recover on its own."""
    cluster("restart-clients")
    run.clients_stale = False


def api_ready() -> bool:
    return kubectl("get", "--raw", "/readyz", check=False).returncode == 0


_HELP: str | None = None


def operator_flags() -> tuple[list[str], list[str]]:
    """(the chaos flags this build's operator takes, those it lacks)."""
    global _HELP
    if _HELP is None:
        _HELP = subprocess.run([sys.executable, "-m", "flotilla.cli", "operator", "--help"], capture_output=True,
                               text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                               timeout=60).stdout
    have, lacking = [], []
    for flag, value in OPERATOR_FLAGS:
        if flag in _HELP:
            have += [flag, value]
        else:
            lacking.append(flag)
    return have, lacking


# --- one case's run ---------------------------------------------------------------------------------
@dataclass
class Run:
    """What one case started and changed, so that it is all undone in `finally`."""

    case: str
    log_dir: Path
    namespace: str
    outcome: Outcome
    procs: list[FlotillaProcess] = field(default_factory=list)
    cordoned: list[str] = field(default_factory=list)
    deleted_nodes: bool = False
    queues: list[str] = field(default_factory=list)  # Queue objects it made (cluster-scoped: deleted at the end)
    clients_stale: bool = False  # the API server was restarted: restart the control plane's clients at the end
    harm: HarmSampler | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # checks that failed without stopping the case

    def note(self, text: str) -> None:
        self.notes.append(text)

    def expect(self, ok: Any, message: str) -> None:
        """A check whose failure is recorded and the case goes on (to find out what else is wrong)."""
        if not ok:
            self.problems.append(message)

    def operator(self, *extra: str, tag: str = "", env: dict[str, str] | None = None) -> FlotillaProcess:
        flags, lacking = operator_flags()
        if lacking and not any("lacks" in n for n in self.notes):
            self.note(f"this operator lacks {', '.join(lacking)}: run without")
        log = self.log_dir / f"{self.case}-operator{tag}.log"
        proc = OperatorProcess(log, "--namespace", self.namespace, *flags, *extra, env=env).start()
        self.procs.append(proc)
        return proc

    def simworkers(self) -> FlotillaProcess:
        proc = SimulatedWorkersProcess(self.log_dir / f"{self.case}-simworkers.log", self.namespace,
                                       speed=SIM_SPEED).start()
        self.procs.append(proc)
        return proc

    def cordon(self, node: str) -> None:
        kubectl("cordon", node)
        self.cordoned.append(node)

    def cleanup(self) -> None:
        for proc in reversed(self.procs):
            if proc.proc and proc.proc.poll() is None:
                try:
                    os.kill(proc.proc.pid, signal.SIGCONT)  # a SIGSTOPped one must be able to exit
                except ProcessLookupError:
                    pass
            proc.stop()
        if not api_ready():  # a case that failed with the API server down
            cluster("start", "etcd")
            cluster("start", "kube-apiserver")
            self.clients_stale = True
        if self.clients_stale:
            cluster("restart-clients")
        if self.deleted_nodes:
            restore_nodes()
        for node in self.cordoned:
            kubectl("uncordon", node, check=False)
        for name in self.queues:
            kubectl("delete", "queue", name, "--wait=false", check=False)
        kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


def case(name: str, body: Callable[[Run], None], finished: bool = True) -> Callable[[Path], Outcome]:
    """A chaos case: `body` runs inside a namespace of its own with a HarmSampler watching it."""

    def run_case(log_dir: Path) -> Outcome:
        started = time.monotonic()
        outcome = Outcome(name)
        namespace = f"chaos-{name[:40]}-{uuid.uuid4().hex[:5]}".replace("_", "-")
        run = Run(name, Path(log_dir), namespace, outcome)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        harm, stuck = None, False
        try:
            wait_for_gpus_free_outside(namespace)
            kubectl("create", "namespace", namespace)
            harm = run.harm = HarmSampler(namespace).__enter__()
            body(run)
            check(not run.problems, "; ".join(run.problems))
            outcome.passed = True
        except Exception as e:  # the case's finding, or the harness broke: either way the case fails
            outcome.passed, stuck = False, isinstance(e, JobStuck)
            run.note(f"FAILED: {type(e).__name__}: {e}")
        finally:
            try:
                if harm is not None:
                    harm.fill(outcome, finished=finished and (outcome.passed or stuck))
            finally:
                run.cleanup()
                outcome.details = "; ".join(filter(None, [*run.notes, outcome.details]))
                outcome.seconds = round(time.monotonic() - started, 1)
        return outcome

    return run_case


# --- jobs -------------------------------------------------------------------------------------------
def job_manifest(name: str, total_steps: int = 600, gpus: int = 2, per_worker: int = 1) -> str:
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "deadlineSeconds": 3600, "totalSteps": total_steps,
            "elasticity": {"minGPUs": gpus, "maxGPUs": gpus, "gpusPerWorker": per_worker},
            "throughput": [{"gpus": 1, "stepsPerSecond": 10.0}, {"gpus": 2, "stepsPerSecond": 18.0},
                           {"gpus": 24, "stepsPerSecond": 40.0}],
            "checkpoint": {"intervalSteps": 50, "restoreSeconds": 5},
            "template": {"spec": {"containers": [{"name": "w", "image": "busybox:1.36",
                                                  "command": ["sh", "-c", "sleep 3600"]}]}},
        },
    })


def job(run: Run, name: str) -> dict[str, Any]:
    return get("trainingjob", name, run.namespace) or {}


def status(run: Run, name: str) -> dict[str, Any]:
    return job(run, name).get("status") or {}


def submit(run: Run, name: str, **kw: Any) -> None:
    r = apply(job_manifest(name, **kw), run.namespace)
    check(r.returncode == 0, f"could not create TrainingJob {name}: {r.stderr.strip()}")


def running_with_progress(run: Run, name: str, steps: int = 60, timeout: float = 60) -> dict[str, Any]:
    return wait_for(f"{name} Running past step {steps}", lambda: (s := status(run, name)).get("phase") == "Running"
                    and (s.get("progress") or {}).get("steps", 0) >= steps and s, timeout=timeout)


def succeeded(run: Run, name: str, timeout: float = 90) -> dict[str, Any]:
    try:
        return wait_for(f"{name} Succeeded", lambda: (s := status(run, name)).get("phase") in ("Succeeded", "Failed")
                        and s, timeout=timeout)
    except AssertionError:
        st = status(run, name)
        raise JobStuck(f"{name} not finished after {timeout:.0f}s: {st.get('phase')} at step "
                       f"{(st.get('progress') or {}).get('steps')}: {st.get('message')!r}") from None


def pods_of(run: Run, uid: str) -> list[dict[str, Any]]:
    return [p for p in items("pods", run.namespace) if owner_uid(p) == uid]


def check_finished(run: Run, name: str, reshards: int, avoid: str | None = None) -> dict[str, Any]:
    done = succeeded(run, name)
    spec = job(run, name)["spec"]
    steps = (done.get("progress") or {}).get("steps")
    check(done.get("phase") == "Succeeded", f"{name} ended {done.get('phase')}: {done.get('message')}")
    check(steps == spec["totalSteps"], f"{name} Succeeded at step {steps} of {spec['totalSteps']}")
    check(int(done.get("reshards", 0)) == reshards,
          f"{name} was resharded {done.get('reshards', 0)} times, expected {reshards}")
    if avoid:
        on = [p["metadata"]["name"] for p in items("pods", run.namespace)
              if p["spec"].get("nodeName") == avoid
              and int(p["metadata"]["labels"].get("flotilla.dev/generation", 0)) >= worker_set_of(done) > 0]
        check(not on, f"worker pods of the new generation on cordoned {avoid}: {on}")
    run.note(f"{name}: Succeeded at step {steps}, {done.get('reshards', 0)} reshards, "
             f"{done.get('restarts', 0)} restarts")
    return done


# --- kill -9 at each step of a reshard --------------------------------------------------------------
KILL_POINTS = {
    # step name -> failpoint (the first matching write of the reshard kills the operator)
    "after-checkpoint-request": "after:PatchAnnotations:checkpoint-request",
    "after-ack-recorded": 'after:PatchStatus:"reshards":1',
    "after-new-pods-created": 'after:CreatePod:"flotilla.dev/generation":"1"',
    "before-old-pods-deleted": "before:DeletePod",
}


def kill_during_reshard(failpoint: str) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        run.simworkers()
        op = run.operator(tag="-killed", env={FAILPOINTS_ENV: failpoint})
        submit(run, "mover", total_steps=MOVER_STEPS)
        first = running_with_progress(run, "mover")
        node = first["placement"][0]["node"]
        run.cordon(node)
        wait_for(f"the operator to hit failpoint {failpoint}", lambda: not op.alive(), timeout=45)
        check(op.proc.returncode == -signal.SIGKILL,
              f"the operator exited {op.proc.returncode} before failpoint {failpoint} (see its log)")
        uid = job(run, "mover")["metadata"]["uid"]
        by_gen: dict[str, list[str]] = {}
        for p in pods_of(run, uid):
            by_gen.setdefault(p["metadata"]["labels"].get("flotilla.dev/generation", "?"), []).append(
                f"{p['metadata']['name']}:{(p.get('status') or {}).get('phase')}")
        st = status(run, "mover")
        run.note(f"killed at {failpoint}: phase {st.get('phase')}, reshards {st.get('reshards', 0)}, "
                 f"checkpoint {st.get('checkpoint')}, pods {by_gen}")
        run.operator(tag="-restarted")
        check_finished(run, "mover", reshards=1, avoid=node)

    return body


# --- kube-apiserver and etcd restarted mid-run ------------------------------------------------------
def component_restart(component: str, down_seconds: float) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        run.simworkers()
        op = run.operator()
        submit(run, "steady", total_steps=900)
        before = running_with_progress(run, "steady")["progress"]["steps"]
        cluster("kill", component)
        run.clients_stale = True
        killed = time.monotonic()
        time.sleep(down_seconds)  # the outage itself
        cluster("start", component)
        wait_for("the API server ready", api_ready, timeout=90)
        back = time.monotonic()
        restart_clients(run)
        moved = wait_for("progress past the outage", lambda: (status(run, "steady").get("progress") or {})
                         .get("steps", 0) > before and time.monotonic(), timeout=60)
        run.note(f"{component} down {back - killed:.0f}s; progress resumed {moved - back:.1f}s after ready")
        check(op.alive(), f"the operator exited ({op.proc.returncode}) during the {component} outage")
        check_finished(run, "steady", reshards=0)

    return body


# --- a watch gap: deletions while the operator's watches back off ----------------------------------
def watch_gap_deletions(run: Run) -> None:
    sim = run.simworkers()
    run.operator()
    submit(run, "keeper", total_steps=600)
    first = running_with_progress(run, "keeper")
    home = first["placement"][0]["node"]
    uid = job(run, "keeper")["metadata"]["uid"]
    generation = str(worker_set_of(first))
    victim = next(p for p in pods_of(run, uid) if p["metadata"]["labels"].get("flotilla.dev/rank") == "1"
                  and p["metadata"]["labels"].get("flotilla.dev/generation") == generation)
    nodes = sorted(n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-l", "type=kwok", "-o",
                                                                     "json").stdout)["items"])
    gone = next(n for n in nodes if n != home)
    # The simulated workers would count the outage as training time and finish the job before its pod is
    # deleted: they pause with the outage (a fresh set takes over from status after it).
    sim.stop()
    cluster("kill", "kube-apiserver")
    run.clients_stale = True
    # The outage: the operator's watches fail and retry every 5 s; when the API server is back they resume
    # from their last version, or (its watch cache restarted: 410) list afresh. The deletions below come as
    # soon as it is back: seen as events by a resumed watch, or as ghosts by a fresh list.
    time.sleep(19)
    cluster("start", "kube-apiserver")
    wait_for("the API server ready", api_ready, timeout=90)
    run.deleted_nodes = True
    deleted_at = time.monotonic()
    kubectl("delete", "pod", victim["metadata"]["name"], "-n", run.namespace, "--grace-period=0", "--force",
            "--wait=false")
    kubectl("delete", "node", gone, "--wait=false")
    run.note(f"deleted pod {victim['metadata']['name']} and node {gone} as soon as the API server was back")
    restart_clients(run)
    run.simworkers()

    def replaced() -> bool:
        st = status(run, "keeper")
        pods = [p for p in pods_of(run, uid) if p["metadata"]["uid"] != victim["metadata"]["uid"]
                and p["metadata"]["labels"].get("flotilla.dev/generation") == str(worker_set_of(st))
                and (p.get("status") or {}).get("phase") == "Running"]
        return len(pods) == int(st.get("workers", 0)) and time.monotonic()

    limit, stuck = RELIST_SECONDS + 15, ""
    try:
        at = wait_for("the deleted worker replaced", replaced, timeout=limit)
        run.note(f"worker replaced {at - deleted_at:.1f}s after its deletion")
    except AssertionError:
        stuck = (f"the deleted worker pod was not replaced within {limit}s (re-list period {RELIST_SECONDS}s): "
                 f"status says {status(run, 'keeper').get('message')!r}")
    # A job that fits only on whole free nodes, three of them: with the deleted node in its view the operator
    # would place it there; without, it waits until the node is back.
    submit(run, "wide", total_steps=200, gpus=24, per_worker=8)
    # Its first decision is what a ghost would change: placed there at once, or left Pending.
    placed = wait_for("the operator to decide on job wide", lambda: (s := status(run, "wide")).get("phase") and s,
                      timeout=30)
    run.expect(gone not in {p["node"] for p in placed.get("placement") or []},
               f"job wide placed on deleted node {gone}: {placed.get('placement')}")
    assert run.harm is not None
    run.expect(not run.harm.ghost_placements, f"placements on deleted nodes: {run.harm.ghost_placements}")
    if stuck:
        raise JobStuck("; ".join([stuck, *run.problems]))
    restore_nodes()
    run.deleted_nodes = False
    check_finished(run, "keeper", reshards=int(first.get("reshards", 0)))
    check_finished(run, "wide", reshards=0)


# --- two operators, the leader frozen past its Lease -------------------------------------------------
def lease_holder(run: Run, name: str) -> str:
    lease = get("lease", name, run.namespace) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def audit_writes_by(agent_part: str, since: float) -> list[str]:
    """Successful writes (not to Leases) in the API server's audit log from a User-Agent containing
    `agent_part`, received after `since` (unix time)."""
    out = []
    path = audit_log()
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ref = e.get("objectRef") or {}
        code = (e.get("responseStatus") or {}).get("code", 0)
        if agent_part not in e.get("userAgent", "") or ref.get("resource") == "leases" or not 200 <= code < 300:
            continue
        if e.get("verb") not in ("create", "update", "patch", "delete"):
            continue
        at = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if at > since:
            out.append(f"{e['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('name')} "
                       f"({e['requestReceivedTimestamp']})")
    return out


WRITE_LOG_MARKS = ("created pod", "deleted pod", "event ", "applied deployment", "applied Service",
                   "applied InferencePool")


def writes_in_log(text: str) -> list[str]:
    """What an operator's log says it wrote (when the audit log cannot tell operators apart)."""
    out = []
    for line in text.splitlines():
        if any(m in line for m in WRITE_LOG_MARKS) or ("reconcile pass:" in line and " objects=0 " not in line):
            out.append(line.strip()[:200])
    return out


def stopped(proc: FlotillaProcess) -> bool:
    """The process is stopped (SIGSTOP: state T)."""
    try:
        return Path(f"/proc/{proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def leader_sigstop(run: Run) -> None:
    """The leader freezes in the middle of a reshard (a failpoint sends it SIGSTOP just before it records the
    new placement, as a long pause would), past its Lease; the standby takes over and completes the move;
    then the old leader is continued, with that write in hand."""
    lease = f"chaos-{run.namespace}"
    elect = ("--leader-elect", "--lease-name", lease, "--lease-namespace", run.namespace,
             "--lease-duration", str(LEASE_SECONDS))
    old = run.operator(*elect, tag="-a", env={FAILPOINTS_ENV: KILL_POINTS["after-ack-recorded"].replace(
        "after:", "before:", 1), FAILPOINT_SIGNAL_ENV: "STOP"})
    old_id = wait_for("the first operator to hold the Lease", lambda: lease_holder(run, lease), timeout=60)
    new = run.operator(*elect, tag="-b")
    wait_for("the second operator to wait for the Lease", lambda: "waiting for lease" in new.log_path.read_text(),
             timeout=60)
    run.simworkers()
    submit(run, "mover", total_steps=MOVER_STEPS)
    first = running_with_progress(run, "mover")
    node = first["placement"][0]["node"]
    run.cordon(node)
    wait_for("the leader to freeze just before it records the new placement", lambda: stopped(old), timeout=45)
    frozen = time.monotonic()
    new_id = wait_for("the standby to take the Lease", lambda: (h := lease_holder(run, lease)) not in ("", old_id)
                      and h, timeout=LEASE_SECONDS * 4)
    taken = time.time()
    run.note(f"Lease taken by the standby {time.monotonic() - frozen:.1f}s after the leader froze")
    moved = wait_for("the new leader to move the job and checkpoint on", lambda: (s := status(run, "mover"))
                     .get("reshards") == 1 and s.get("phase") == "Running"
                     and int((s.get("checkpoint") or {}).get("step", 0)) >= int(first["progress"]["steps"]) + 100
                     and s, timeout=60)

    with open(old.log_path, "a") as f:  # nothing else writes to it while it is stopped
        f.write("=== chaos: SIGCONT ===\n")
    os.kill(old.proc.pid, signal.SIGCONT)
    try:
        wait_for("the old leader to step down", lambda: not old.alive(), timeout=30)
    except AssertionError:
        raise CaseFailed("the old leader was still running 30s after SIGCONT, with the Lease held by another") \
            from None
    after = old.log_path.read_text().rsplit("=== chaos: SIGCONT ===", 1)[-1]
    audited = audit_writes_by(f"flotilla-operator/{old_id}", taken)
    if audit_writes_by(f"flotilla-operator/{new_id}", taken):  # the audit log tells the operators apart
        run.expect(not audited, f"the old leader wrote after the takeover: {audited[:5]}")
    else:
        logged = writes_in_log(after)
        run.note("the audit log cannot tell the operators apart (no User-Agent flotilla-operator/<identity>): "
                 "judged from the old leader's own log")
        run.expect(not logged, f"the old leader wrote after SIGCONT: {logged[:5]}")
    st = status(run, "mover")
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
    run.expect(st.get("reshards") == 1 and st.get("placement") == moved.get("placement")
               and int((st.get("checkpoint") or {}).get("step", 0)) >= int(moved["checkpoint"]["step"]),
               f"status went back after the old leader resumed: reshards {st.get('reshards')}, placement "
               f"{st.get('placement')}, checkpoint {st.get('checkpoint')} (the new leader had "
               f"{moved.get('placement')}, checkpoint step {moved['checkpoint']['step']})")
    for what, text in (("status.message", st.get("message") or ""), ("Ready", ready.get("message") or "")):
        run.expect(node not in text, f"{what} names the node the job left: {text!r}")
    run.expect(old.proc.returncode == 1, f"the old leader exited {old.proc.returncode}, expected 1")
    run.expect("stepping down" in after, "the old leader did not log `stepping down`")
    check(new.alive(), f"the new leader exited ({new.proc.returncode})")
    check_finished(run, "mover", reshards=1, avoid=node)


# --- a new job with a deleted job's name ------------------------------------------------------------
def job_name_reuse(run: Run) -> None:
    run.simworkers()
    run.operator()
    submit(run, "reuse", total_steps=MOVER_STEPS // 3)
    check_finished(run, "reuse", reshards=0)
    old = job(run, "reuse")
    old_uid = old["metadata"]["uid"]
    orphans = {p["metadata"]["name"] for p in pods_of(run, old_uid)}
    assert run.harm is not None
    run.harm.forget(old_uid)
    kubectl("delete", "trainingjob", "reuse", "-n", run.namespace, "--cascade=orphan")
    wait_for("the old job gone", lambda: (get("trainingjob", "reuse", run.namespace) or {})
             .get("metadata", {}).get("uid") != old_uid, timeout=30)
    check(orphans and all(get("pod", n, run.namespace) for n in orphans),
          f"the old job's pods did not stay after an orphaning delete: {orphans}")
    submit(run, "reuse", total_steps=2 * MOVER_STEPS // 3)
    new_uid = wait_for("the new job", lambda: job(run, "reuse").get("metadata", {}).get("uid"), timeout=30)
    check(new_uid != old_uid, "the new TrainingJob has the old one's uid")
    done = check_finished(run, "reuse", reshards=0)
    mine = pods_of(run, new_uid)
    check(mine, "the new job Succeeded with no pod of its own")
    check(not orphans & {p["metadata"]["name"] for p in mine},
          f"the new job's pods have the old pods' names: {sorted(orphans)}")
    run.note(f"old pods {sorted(orphans)} left alone; the new job ran {len(mine)} pods of its own to step "
             f"{done['progress']['steps']}")


# --- the operator killed in the middle of a reclaim ---------------------------------------------------
def schedulable_gpus() -> int:
    return sum(int((n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
               for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
               if not (n.get("spec") or {}).get("unschedulable"))


def make_queue(run: Run, name: str, nominal: int, namespaces: list[str] | None = None) -> None:
    spec: dict[str, Any] = {"resources": [{"name": "nvidia.com/gpu", "nominal": nominal}]}
    if namespaces:
        spec["namespaces"] = namespaces
    r = kubectl("apply", "-f", "-", check=False, stdin=json.dumps(
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}))
    check(r.returncode == 0, f"could not create Queue {name}: {r.stderr.strip()}")
    run.queues.append(name)


def elastic_manifest(name: str, min_gpus: int, max_gpus: int, total_steps: int, queue: str | None = None) -> str:
    body = json.loads(job_manifest(name, total_steps=total_steps, gpus=min_gpus, per_worker=2))
    body["spec"]["elasticity"]["maxGPUs"] = max_gpus
    body["spec"]["throughput"] = [{"gpus": 1, "stepsPerSecond": 10.0},
                                  {"gpus": max_gpus, "stepsPerSecond": 9.0 * max_gpus}]
    body["spec"]["checkpoint"]["restoreSeconds"] = 2
    body["spec"]["deadlineSeconds"] = 360_000  # met on min_gpus: admitted out of its own queue's share
    if queue:
        body["spec"]["queue"] = queue
    return json.dumps(body)


def kill_mid_reclaim(run: Run) -> None:
    total = schedulable_gpus()
    half = total // 2 // 2 * 2
    a, b = f"{run.namespace}-a", f"{run.namespace}-b"
    make_queue(run, a, half, [run.namespace])
    make_queue(run, b, half)
    run.simworkers()
    op = run.operator(tag="-killed", env={FAILPOINTS_ENV: "after:PatchAnnotations:reclaim"})
    check(apply(elastic_manifest("borrower", 2, total, 1_000_000), run.namespace).returncode == 0,
          "could not create the borrower")
    wait_for("the borrower borrows team B's idle GPUs", lambda: (s := status(run, "borrower")).get("phase") == "Running"
             and s.get("gpus", 0) > half and s, timeout=90)
    before = (status(run, "borrower").get("progress") or {}).get("steps", 0)
    check(apply(elastic_manifest("owner", half, half, 20 * MOVER_STEPS, queue=b), run.namespace).returncode == 0,
          "could not create the owner's job")
    wait_for("the operator to die right after asking for the reclaim's checkpoint", lambda: not op.alive(), timeout=60)
    check(op.proc.returncode == -signal.SIGKILL, f"the operator exited {op.proc.returncode} before the failpoint")
    run.note(f"killed after the reclaim's checkpoint request; borrower {status(run, 'borrower').get('phase')} at "
             f"{status(run, 'borrower').get('gpus')} GPUs")
    run.operator(tag="-restarted")
    owner = wait_for("the owner's job running on its share", lambda: (s := status(run, "owner")).get("phase")
                     == "Running" and s.get("gpus") == half and s, timeout=90)
    gave_back = status(run, "borrower")
    check(gave_back.get("gpus", 0) <= total - half, f"the borrower still holds {gave_back.get('gpus')} GPUs")
    check((gave_back.get("checkpoint") or {}).get("step", -1) >= before,
          f"the borrower resumed at step {(gave_back.get('checkpoint') or {}).get('step')}, before {before}")
    reasons = [e["reason"] for e in items("events", run.namespace) if e["involvedObject"]["name"] == "borrower"]
    check("Reclaimed" in reasons and "RestartFromCheckpoint" not in reasons, f"the borrower's Events: {reasons}")
    run.note(f"owner running on {owner['gpus']} GPUs; borrower on {gave_back.get('gpus')} GPUs from its checkpoint "
             f"at step {(gave_back.get('checkpoint') or {}).get('step')}, {gave_back.get('reshards')} reshards")


CASES: dict[str, Callable[[Path], Outcome]] = {
    **{f"operator-kill-{step}": case(f"operator-kill-{step}", kill_during_reshard(fp))
       for step, fp in KILL_POINTS.items()},
    # The simulated workers count an outage as training time (real ones train on): the jobs are long enough
    # to run on after it.
    "apiserver-restart": case("apiserver-restart", component_restart("kube-apiserver", down_seconds=12)),
    "etcd-restart": case("etcd-restart", component_restart("etcd", down_seconds=8)),
    "watch-gap-deletions": case("watch-gap-deletions", watch_gap_deletions),
    "leader-sigstop": case("leader-sigstop", leader_sigstop),
    "job-name-reuse": case("job-name-reuse", job_name_reuse),
    "operator-kill-mid-reclaim": case("operator-kill-mid-reclaim", kill_mid_reclaim, finished=False),
}
