"""Teams on the real control plane: two queues with nominal shares; team A's elastic job borrows team B's idle
GPUs and gives them back through a checkpoint when team B submits a deadline job; a best-effort job (its deadline
cannot be promised) runs without a guarantee on borrowed GPUs and gives them back the same way; a job naming a
missing queue waits with a condition; a malformed Queue is refused by the API server with the field named."""

from __future__ import annotations

import json
import time

import pytest

from e2e.kube import SimulatedWorkersProcess, apply, get, items, kubectl, training_job, wait_for

OPERATOR_ARGS = ("--policy", "elastic-deadline")


def queue(name: str, nominal: int, namespaces: list[str] | None = None, **gpu: int) -> str:
    spec: dict = {"resources": [{"name": "nvidia.com/gpu", "nominal": nominal, **gpu}]}
    if namespaces:
        spec["namespaces"] = namespaces
    return json.dumps({"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name},
                       "spec": spec})


def apply_queue(manifest: str):
    return kubectl("apply", "-f", "-", stdin=manifest, check=False)


def get_queue(name: str) -> dict | None:
    r = kubectl("get", "queue", name, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def cluster_gpus() -> int:
    return sum(int((n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
               for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
               if not (n.get("spec") or {}).get("unschedulable"))


@pytest.fixture
def queues(namespace):
    made: list[str] = []
    yield made
    for name in made:
        kubectl("delete", "queue", name, "--wait=false", check=False)


def test_a_borrower_gives_gpus_back_through_a_checkpoint_and_the_owner_is_admitted(operator, namespace, queues,
                                                                                   log_dir):
    total = cluster_gpus()
    half = total // 2
    a, b = f"{namespace}-a", f"{namespace}-b"
    for name, ns in ((a, [namespace]), (b, None)):
        assert apply_queue(queue(name, half, ns)).returncode == 0
        queues.append(name)
    sim = SimulatedWorkersProcess(log_dir / f"simworkers-{namespace}.log", namespace).start()
    try:
        # Team A (its namespace's queue) runs an elastic job that could use the whole cluster.
        # Its deadline is met on 2 GPUs (admitted out of A's own share); every GPU more is speed.
        borrower = training_job("borrower", deadlineSeconds=360_000, totalSteps=1_000_000,
                                elasticity={"minGPUs": 2, "maxGPUs": total, "gpusPerWorker": 2},
                                throughput=[{"gpus": 1, "stepsPerSecond": 10.0}, {"gpus": total,
                                                                                   "stepsPerSecond": 9.0 * total}],
                                checkpoint={"intervalSteps": 100, "restoreSeconds": 2})
        assert apply(borrower, namespace).returncode == 0

        def tj(name):
            return (get("trainingjob", name, namespace) or {}).get("status", {})

        def q(name):
            return (get_queue(name) or {}).get("status", {})

        borrowing = wait_for("team A borrows team B's idle GPUs",
                             lambda: tj("borrower").get("phase") == "Running" and tj("borrower").get("gpus", 0) > half
                             and q(a).get("borrowed", 0) > 0 and q(b).get("lent", 0) > 0 and tj("borrower"),
                             timeout=90)
        assert borrowing["queue"] == a
        table = kubectl("get", "queues", a, b).stdout
        header = table.splitlines()[0].split()
        assert header == ["NAME", "NOMINAL", "USED", "BORROWED", "LENT", "ADMITTED", "PENDING", "AGE"], table
        print(table)

        # Team B comes back: a deadline job that needs its nominal share.
        owner = training_job("owner", deadlineSeconds=1800, totalSteps=20_000, queue=b,
                             elasticity={"minGPUs": half, "maxGPUs": half, "gpusPerWorker": 2},
                             throughput=[{"gpus": half, "stepsPerSecond": 20.0}],
                             checkpoint={"intervalSteps": 100, "restoreSeconds": 2})
        before = tj("borrower")["progress"]["steps"]
        submitted = time.monotonic()
        assert apply(owner, namespace).returncode == 0
        running = wait_for("team B's job admitted and running on its share",
                           lambda: (s := tj("owner")).get("phase") == "Running" and s.get("gpus") == half and s,
                           timeout=90)
        reclaim_seconds = time.monotonic() - submitted
        assert running["queue"] == b and running["deadlineMet"] is True
        gave_back = tj("borrower")
        assert gave_back["gpus"] <= total - half and gave_back["reshards"] >= 1
        assert gave_back["checkpoint"]["step"] >= before, "the checkpoint is taken after the reclaim was asked for"

        events = [e for e in items("events", namespace) if e["involvedObject"]["name"] == "borrower"]
        reasons = [e["reason"] for e in events]
        assert {"Reclaimed", "CheckpointRequested", "CheckpointWritten", "Resharding"} <= set(reasons)
        assert "RestartFromCheckpoint" not in reasons and "ReclaimStops" not in reasons
        reclaimed = next(e for e in events if e["reason"] == "Reclaimed")
        assert f"back to queue '{b}'" in reclaimed["message"]
        shrink = [e["message"] for e in events if e["reason"] == "Resharding" and "reclaim" in e["message"]]
        assert shrink and not any("steps lost" in m for m in shrink), shrink

        usage = wait_for("queue status after the reclaim",
                         lambda: (s := q(b)).get("used") == half and s.get("admitted") == 1 and s, timeout=30)
        assert usage["nominal"] == half and usage["borrowed"] == 0
        print(f"reclaim: team B's job running {reclaim_seconds:.1f} s after it was submitted "
              f"(checkpoint + restore of the borrower included)")
        print(kubectl("get", "queues", a, b).stdout)
    finally:
        sim.stop()


def test_a_best_effort_job_runs_without_a_guarantee_on_borrowed_gpus_and_gives_them_back(operator, namespace,
                                                                                         queues, log_dir):
    total = cluster_gpus()
    half = total // 2
    a, b = f"{namespace}-a", f"{namespace}-b"
    for name, ns in ((a, [namespace]), (b, None)):
        assert apply_queue(queue(name, half, ns)).returncode == 0
        queues.append(name)
    sim = SimulatedWorkersProcess(log_dir / f"simworkers-{namespace}-be.log", namespace).start()
    try:
        # Team A's job cannot make its deadline on any number of GPUs: with bestEffort it runs without a guarantee.
        late = training_job("late", deadlineSeconds=60, totalSteps=10_000_000, bestEffort=True,
                            elasticity={"minGPUs": 2, "maxGPUs": total, "gpusPerWorker": 2},
                            throughput=[{"gpus": 1, "stepsPerSecond": 10.0}, {"gpus": total,
                                                                              "stepsPerSecond": 9.0 * total}],
                            checkpoint={"intervalSteps": 100, "restoreSeconds": 2})
        assert apply(late, namespace).returncode == 0

        def tj(name):
            return (get("trainingjob", name, namespace) or {}).get("status", {})

        def admitted(status):
            return next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), None)

        running = wait_for("the best-effort job runs on borrowed GPUs",
                           lambda: (s := tj("late")).get("phase") == "Running" and s.get("gpus", 0) > half and s,
                           timeout=90)
        cond = admitted(running)
        assert (cond["status"], cond["reason"]) == ("True", "BestEffort"), cond
        assert "best-effort" in cond["message"] and not running.get("guaranteedShare")

        owner = training_job("owner", deadlineSeconds=1800, totalSteps=20_000, queue=b,
                             elasticity={"minGPUs": half, "maxGPUs": half, "gpusPerWorker": 2},
                             throughput=[{"gpus": half, "stepsPerSecond": 20.0}],
                             checkpoint={"intervalSteps": 100, "restoreSeconds": 2})
        assert apply(owner, namespace).returncode == 0
        got = wait_for("team B's guaranteed job running on its share",
                       lambda: (s := tj("owner")).get("phase") == "Running" and s.get("gpus") == half and s,
                       timeout=90)
        assert got["deadlineMet"] is True and admitted(got)["reason"] == "Admitted"
        gave_back = tj("late")
        assert gave_back["gpus"] <= total - half and gave_back["reshards"] >= 1
        assert admitted(gave_back)["reason"] == "BestEffort"  # still without a guarantee: not admitted again
        reasons = [e["reason"] for e in items("events", namespace) if e["involvedObject"]["name"] == "late"]
        assert "Reclaimed" in reasons and "ReclaimStops" not in reasons and "RestartFromCheckpoint" not in reasons
    finally:
        sim.stop()


def test_a_job_naming_a_missing_queue_waits_with_a_condition(operator, namespace, queues):
    name = f"{namespace}-real"
    assert apply_queue(queue(name, 4)).returncode == 0
    queues.append(name)
    job = training_job("lost", deadlineSeconds=3600, totalSteps=100, queue=f"{namespace}-nope",
                       elasticity={"minGPUs": 1, "maxGPUs": 2},
                       throughput=[{"gpus": 1, "stepsPerSecond": 1.0}])
    assert apply(job, namespace).returncode == 0

    def condition():
        status = (get("trainingjob", "lost", namespace) or {}).get("status", {})
        return next((c for c in status.get("conditions") or [] if c["type"] == "QueueResolved"), None), status

    cond, status = wait_for("the QueueResolved condition", lambda: (c := condition())[0] and c, timeout=30)
    assert (cond["status"], cond["reason"]) == ("False", "QueueNotFound")
    assert f"'{namespace}-nope' does not exist" in cond["message"]
    assert status.get("phase") in (None, "Pending") and not status.get("gpus")
    assert not items("pods", namespace)


@pytest.mark.parametrize("gpu, field, says", [
    ({"nominal": 4, "lendingLimit": 8}, "spec.resources[0].lendingLimit", "must be <="),
    ({"nominal": -1}, "spec.resources[0].nominal", "greater than or equal to 0"),
    ({"nominal": 4, "borrowingLimit": -2}, "spec.resources[0].borrowingLimit", "greater than or equal to 0"),
])
def test_a_malformed_queue_is_refused_naming_the_field(gpu, field, says):
    bad = json.loads(queue("malformed", 0))
    bad["spec"]["resources"][0] = {"name": "nvidia.com/gpu", **gpu}
    refused = apply_queue(json.dumps(bad))
    assert refused.returncode != 0
    assert field in refused.stderr and says in refused.stderr, refused.stderr


def test_a_queue_that_is_its_own_parent_is_refused():
    bad = json.loads(queue("selfish", 4))
    bad["spec"]["parent"] = "selfish"
    refused = apply_queue(json.dumps(bad))
    assert refused.returncode != 0 and "spec.parent" in refused.stderr, refused.stderr
