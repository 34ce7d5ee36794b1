"""Teams' Queues where people look, on a real API server (no operator: the test writes the status the operator
would, so each figure is known):

* the controller mirrors Queues and the queue of each TrainingJob: /v1/queues, a queue's jobs and loans, its
  usage over time, the loan decisions, the per-queue metrics; a reclaim (the job's checkpoint request naming it,
  then a smaller allocation) is recorded with its reason and duration and counted; a deleted Queue answers 404;
* `flotilla queues import` reads real Kueue v1beta2 ClusterQueues and Cohorts (Kueue's own CRDs, from its Go
  module) and the namespaces' labels from the cluster, prints the Queues, and applies them with --apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from e2e.kube import ROOT, apply, controller_api, kubectl, training_job, wait_for

QUEUE_CRD = ROOT / "crds" / "queues.flotilla.dev.yaml"
KUEUE_VERSION = "v0.17.0"
pytestmark = pytest.mark.skipif(not QUEUE_CRD.exists(), reason=f"the Queue CRD ({QUEUE_CRD.name}) is not in crds/")


@pytest.fixture(scope="module", autouse=True)
def queue_crd():
    kubectl("wait", "--for", "condition=established", "--timeout=60s", "crd/queues.flotilla.dev")


def queue(name: str, nominal: int, **spec) -> str:
    return json.dumps({"apiVersion": "flotilla.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name},
                       "spec": {"resources": [{"name": "nvidia.com/gpu", "nominal": nominal}], **spec}})


def get_queue(name: str) -> dict:
    r = kubectl("get", "queue", name, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def set_status(kind: str, name: str, status: dict, namespace: str | None = None) -> None:
    kubectl("patch", kind, name, *(("-n", namespace) if namespace else ()), "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def usage(used=0, borrowed=0, lent=0, nominal=8, admitted=0, pending=0, guaranteed=0) -> dict:
    return {"nominal": nominal, "used": used, "borrowed": borrowed, "lent": lent, "admitted": admitted,
            "pending": pending, "guaranteed": guaranteed}


def test_queues_jobs_loans_usage_reclaims_and_metrics(namespace, log_dir, tmp_path):
    suffix = uuid.uuid4().hex[:6]
    qa, qb = f"e2e-a-{suffix}", f"e2e-b-{suffix}"
    try:
        for name in (qa, qb):
            kubectl("apply", "-f", "-", stdin=queue(name, 8, namespaces=[f"{name}-ns"]))
        with controller_api(log_dir, tmp_path) as api:
            set_status("queue", qa, usage())
            set_status("queue", qb, usage())
            # Team B idle: team A's job borrows B's GPUs.
            job = training_job("big", deadlineSeconds=3600, totalSteps=30000,
                               elasticity={"minGPUs": 4, "maxGPUs": 16, "gpusPerWorker": 4},
                               throughput=[{"gpus": 4, "stepsPerSecond": 5.0}, {"gpus": 16, "stepsPerSecond": 18.0}],
                               checkpoint={"intervalSteps": 50, "restoreSeconds": 5})
            assert apply(job, namespace).returncode == 0
            set_status("trainingjob", "big", {"phase": "Running", "gpus": 12, "queue": qa,
                                              "placement": [{"node": "n1", "gpus": 8}, {"node": "n2", "gpus": 4}]},
                       namespace)
            set_status("queue", qa, usage(used=12, borrowed=4, admitted=1, guaranteed=4))
            set_status("queue", qb, usage(lent=4))

            def mirrored():
                items = {q["name"]: q for q in api.get("/v1/queues").json()["items"]}
                return (qa in items and items[qa]["status"].get("borrowed") == 4 and qb in items
                        and items[qb]["status"].get("lent") == 4 and items)
            items = wait_for("both queues with their status", mirrored, timeout=30)
            assert items[qa]["spec"]["namespaces"] == [f"{qa}-ns"]
            detail = wait_for("team A's job", lambda: (d := api.get(f"/v1/queues/{qa}").json())["jobs"] and d)
            assert [j["key"] for j in detail["jobs"]] == [f"{namespace}/big"] and detail["jobs"][0]["gpus"] == 12
            assert detail["loans"] == {"lentTo": [], "borrowedFrom": [{"queue": qb, "gpus": 4}]}
            assert api.get(f"/v1/queues/{qb}").json()["loans"]["lentTo"] == [{"queue": qa, "gpus": 4}]
            assert [h["reason"].split(" (")[0] for h in detail["history"]] == ["borrowed 4 GPUs"]

            # Team B needs its GPUs: the operator asks A's job for a checkpoint naming the reclaim, then the job
            # runs on fewer GPUs.
            request = {"generation": 1, "time": now_iso(), "requestedBy": "operator",
                       "reason": f"reclaim: gives 4 GPUs back to queue '{qb}' through a checkpoint (nominal share "
                                 "needed); marginal gain"}
            kubectl("annotate", "trainingjob", "big", "-n", namespace, "--overwrite",
                    f"flotilla.dev/checkpoint-request={json.dumps(request)}")
            set_status("trainingjob", "big", {"gpus": 8, "placement": [{"node": "n1", "gpus": 8}]}, namespace)
            set_status("queue", qa, usage(used=8, admitted=1, guaranteed=4))
            set_status("queue", qb, usage(used=4, admitted=1, guaranteed=4))

            def reclaimed():
                found = api.get("/v1/decisions", params={"kind": "reclaim", "object": f"{namespace}/big"}).json()
                return found["items"]
            reclaim = wait_for("the reclaim decision", reclaimed, timeout=30)[0]
            assert reclaim["reason"] == request["reason"]
            assert reclaim["inputs"]["fromQueue"] == qa and reclaim["inputs"]["toQueue"] == qb
            assert reclaim["inputs"]["gpus"] == 4 and 0 <= reclaim["inputs"]["seconds"] < 60
            detail = wait_for("team A gave back", lambda: (d := api.get(f"/v1/queues/{qa}").json())
                              ["status"].get("borrowed") == 0 and d)
            assert [r["object"] for r in detail["reclaims"]] == [f"{namespace}/big"]
            assert detail["loans"] == {"lentTo": [], "borrowedFrom": []}
            points = api.get(f"/v1/queues/{qa}/usage").json()["items"]
            assert [(p["used"], p["borrowed"]) for p in points][-2:] == [(12, 4), (8, 0)]

            metrics = api.get("/metrics").text
            assert f'flotilla_queue_used_gpus{{queue="{qb}"}} 4.0' in metrics
            assert f'flotilla_queue_borrowed_gpus{{queue="{qa}"}} 0.0' in metrics
            assert f'flotilla_queue_reclaims_total{{from_queue="{qa}",queue="{qb}"}} 1.0' in metrics
            assert f'flotilla_queue_reclaim_duration_seconds_count{{queue="{qb}"}} 1.0' in metrics

            kubectl("delete", "queue", qa)
            wait_for("the deleted queue answers 404", lambda: api.get(f"/v1/queues/{qa}").status_code == 404)
            assert api.get(f"/v1/queues/{qa}").json()["error"]["message"] == f"Queue '{qa}' not found"
    finally:
        kubectl("delete", "queue", qa, qb, "--ignore-not-found", check=False)


def kueue_crds() -> Path | None:
    """Kueue's CRDs (ClusterQueue, Cohort) from its Go module, pinned; None when Go cannot fetch it."""
    if os.environ.get("FLOTILLA_KUEUE_CRDS"):
        return Path(os.environ["FLOTILLA_KUEUE_CRDS"])
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        return None
    with tempfile.TemporaryDirectory() as empty:  # outside any module
        r = subprocess.run([go, "mod", "download", "-json", f"sigs.k8s.io/kueue@{KUEUE_VERSION}"], cwd=empty,
                           capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None
    return Path(json.loads(r.stdout)["Dir"]) / "config" / "components" / "crd" / "bases"


def flotilla(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "flotilla.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, input=stdin, timeout=60)


def test_import_reads_kueue_from_the_cluster_and_applies_the_queues():
    crds = kueue_crds()
    if crds is None or not (crds / "kueue.x-k8s.io_clusterqueues.yaml").exists():
        pytest.skip(f"Kueue {KUEUE_VERSION}'s CRDs are not available (set FLOTILLA_KUEUE_CRDS to their folder)")
    for name in ("clusterqueues", "cohorts"):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds / f"kueue.x-k8s.io_{name}.yaml"))
        kubectl("wait", "--for", "condition=established", "--timeout=60s", f"crd/{name}.kueue.x-k8s.io")
    s = uuid.uuid4().hex[:6]
    org, ta, tb, ns_a = f"org-{s}", f"ta-{s}", f"tb-{s}", f"e2e-kq-{s}"
    kubectl("create", "namespace", ns_a)
    kubectl("label", "namespace", ns_a, f"team=a-{s}")
    kueue = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": org},
         "spec": {"fairSharing": {"weight": "2"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ta},
         "spec": {"cohortName": org, "namespaceSelector": {"matchLabels": {"team": f"a-{s}"}},
                  "resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [{
                      "name": "h100", "resources": [{"name": "cpu", "nominalQuota": "64"},
                                                    {"name": "nvidia.com/gpu", "nominalQuota": 8,
                                                     "borrowingLimit": 4}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": tb},
         "spec": {"cohortName": org, "namespaceSelector": {},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [{
                      "name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8,
                                                     "lendingLimit": 6}]}]}]}},
    ]
    try:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(kueue))
        r = flotilla("queues", "import", "--apply")
        assert r.returncode == 0, r.stderr
        printed = {q["metadata"]["name"]: q["spec"] for q in yaml.safe_load_all(r.stdout)}
        assert printed[org] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 16, "borrowingLimit": 0,
                                               "lendingLimit": 0}], "weight": 2.0}
        assert printed[ta] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 8, "borrowingLimit": 4}],
                               "parent": org, "namespaces": [ns_a]}  # the label selector, matched in the cluster
        assert printed[tb] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 8, "lendingLimit": 6}],
                               "parent": org}
        notes = r.stderr.splitlines()
        assert f"note: ClusterQueue {ta}: spec.resourceGroups[0].flavors[h100].resources[cpu]: no equivalent " \
               "(Queues hold nvidia.com/gpu only); left out" in notes
        assert any(line.startswith(f"note: ClusterQueue {tb}: spec.namespaceSelector: selects every namespace")
                   for line in notes), notes
        for name, spec in printed.items():
            applied = get_queue(name)
            assert applied.get("spec", {}).get("resources") == spec["resources"], (name, applied)
        assert get_queue(ta)["spec"]["parent"] == org
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(kueue), check=False)
        kubectl("delete", "queue", org, ta, tb, "--ignore-not-found", check=False)
        kubectl("delete", "namespace", ns_a, "--wait=false", check=False)
