"""The Helm chart on a real API server: install, run the components with the chart's own ServiceAccounts
(so the RBAC it grants is shown to be enough), leader election among operator replicas, upgrade, uninstall.

The chart's pods would act beside the operator processes these tests start (on kind they really run), so
the release here points at an image registry that does not exist: its pods never start anywhere, and the
components run as local processes holding tokens of the chart's ServiceAccounts.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from e2e.kube import ROOT, FlotillaProcess, OperatorProcess, get, items, kubectl, wait_for

RELEASE = "fl"
FULL = f"{RELEASE}-flotilla"
OP, CTL, AGENT = f"{FULL}-operator", f"{FULL}-controller", f"{FULL}-agent"
LEASE_SECONDS = 6
NOT_PULLED = ["--set", "image.registry=e2e.invalid"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    path = shutil.which("helm")
    if not path:
        pytest.skip("helm is not on PATH: `export PATH=$(e2e/cluster.sh bin):$PATH`")
    r = subprocess.run([path, *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {r.stderr.strip()}")
    return r


@pytest.fixture(scope="module")
def release():
    ns = f"flotilla-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    helm("install", RELEASE, str(ROOT / "charts" / "flotilla"), "-n", ns, *NOT_PULLED,
         "--set", f"operator.leaderElection.leaseDurationSeconds={LEASE_SECONDS}")
    yield ns
    helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
    kubectl("delete", "namespace", ns, "--wait=false", check=False)


def kubeconfig_for(service_account: str, ns: str, path: Path) -> Path:
    """A kubeconfig for the current cluster that authenticates as the ServiceAccount (a bound token)."""
    token = kubectl("create", "token", service_account, "-n", ns, "--duration=2h").stdout.strip()
    current = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    context = next(c["context"] for c in current["contexts"] if c["name"] == current["current-context"])
    cluster = next(c for c in current["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": service_account, "context": {"cluster": cluster["name"], "user": service_account}}],
        "current-context": service_account}))
    path.chmod(0o600)
    return path


def start_operator(kubeconfig: Path, log: Path, ns: str, monkeypatch) -> FlotillaProcess:
    # FIFO gang at minGPUs: the scenarios below check exact GPU counts.
    with monkeypatch.context() as m:
        m.setenv("KUBECONFIG", str(kubeconfig))
        return OperatorProcess(log, "--policy", "fifo-gang", "--leader-elect", f"--lease-name={OP}", f"--lease-namespace={ns}",
                               f"--lease-duration={LEASE_SECONDS}").start()


def lease(ns: str) -> dict:
    return get("lease", OP, ns)["spec"]


def leader_in(log: Path) -> str | None:
    m = re.search(r"became leader: lease \S+ held by (\S+)", log.read_text())
    return m.group(1) if m else None


LOG_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def permission_errors(log: Path) -> list[str]:
    # the timestamp is cut off first: its milliseconds may read 403
    return [line for line in log.read_text().splitlines()
            if re.search(r"\b403\b|[Ff]orbidden|[Nn]ot enough permissions", LOG_TIMESTAMP.sub("", line))]


def can_i(service_account: str, ns: str, verb: str, resource: str, where: str) -> bool:
    r = kubectl("auth", "can-i", verb, resource, f"--as=system:serviceaccount:{ns}:{service_account}", "-n", where,
                check=False)
    return r.stdout.strip() == "yes"


def test_install_creates_every_object(release):
    ns = release
    assert json.loads(helm("status", RELEASE, "-n", ns, "-o", "json").stdout)["info"]["status"] == "deployed"
    for crd in ("trainingjobs.flotilla.dev", "servingdeployments.flotilla.dev"):
        assert get("crd", crd, "") is not None
    for name in (OP, CTL, AGENT):
        assert get("serviceaccount", name, ns)
    for kind in ("clusterrole", "clusterrolebinding"):
        for name in (OP, CTL):
            assert get(kind, name, "")
    assert get("role", f"{OP}-leader-election", ns) and get("rolebinding", f"{OP}-leader-election", ns)
    assert get("lease", OP, ns)
    assert get("deployment", OP, ns)["spec"]["replicas"] == 2
    assert get("deployment", CTL, ns) and get("service", CTL, ns) and get("persistentvolumeclaim", CTL, ns)
    assert get("secret", f"{FULL}-tokens", ns)
    # The DaemonSet is scheduled onto exactly the GPU nodes.
    gpu_nodes = len(items("nodes", "default", "nvidia.com/gpu.present=true"))
    assert gpu_nodes > 0
    wait_for("agent DaemonSet scheduled on every GPU node",
             lambda: get("daemonset", AGENT, ns).get("status", {}).get("desiredNumberScheduled") == gpu_nodes)


def test_the_operator_runs_training_and_serving_with_its_own_serviceaccount(release, namespace, tmp_path, log_dir,
                                                                            monkeypatch):
    log = log_dir / "chart-operator-rbac.log"
    log.write_text("")
    op = start_operator(kubeconfig_for(OP, release, tmp_path / "operator.kubeconfig"), log, release, monkeypatch)
    try:
        kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples"))
        for name, gpus in (("llama-ft", 8), ("resnet50", 2)):
            tj = wait_for(f"{name} Running", lambda: (t := get("trainingjob", name, namespace))
                          and t.get("status", {}).get("phase") == "Running" and t, timeout=90)
            assert tj["status"]["gpus"] == gpus
            pods = items("pods", namespace, f"flotilla.dev/job-uid={tj['metadata']['uid']}")
            assert pods and all(p["status"]["phase"] == "Running" for p in pods)
        sd = wait_for("chat Ready", lambda: (s := get("servingdeployment", "chat", namespace))
                      and s.get("status", {}).get("phase") == "Ready" and s, timeout=90)
        assert sd["status"]["ratio"] == "1:2"
        deps = {d["metadata"]["name"]: d["spec"]["replicas"] for d in items("deployments", namespace)}
        assert deps == {"chat-prefill": 1, "chat-decode": 2}
        # A manual edit of the replicas is put back: patch (server-side apply) on an existing Deployment.
        kubectl("scale", "deployment", "chat-decode", "-n", namespace, "--replicas=5")
        wait_for("chat-decode back at 2", lambda: get("deployment", "chat-decode", namespace)["spec"]["replicas"] == 2)
        # Routine transitions are conditions, not Events.
        conditions = {c["type"]: c["reason"] for c in get("trainingjob", "llama-ft", namespace)["status"]["conditions"]}
        assert conditions == {"Admitted": "Admitted", "Ready": "WorkersRunning"}
        # Its ServiceAccount may post Events (the serving plan's).
        assert "Scaled" in {e["reason"] for e in items("events", namespace)}
        # Deleting a job: the operator deletes its pods (delete), or the garbage collector does (owner refs).
        uid = get("trainingjob", "resnet50", namespace)["metadata"]["uid"]
        kubectl("delete", "trainingjob", "resnet50", "-n", namespace, "--wait=true", "--timeout=30s")
        wait_for("resnet50's pods gone", lambda: not items("pods", namespace, f"flotilla.dev/job-uid={uid}"))
        assert lease(release)["holderIdentity"] == leader_in(log)
        assert permission_errors(log) == []
    finally:
        op.stop()
        kubectl("delete", "trainingjob,servingdeployment", "--all", "-n", namespace, "--wait=true", "--timeout=60s",
                check=False)
    # A clean stop hands the Lease back.
    assert lease(release)["holderIdentity"] in ("", None)


def test_each_serviceaccount_may_do_only_its_job(release):
    ns = release
    # The agent never talks to the API: no verbs at all.
    for verb, resource in (("delete", "pods"), ("list", "pods"), ("get", "nodes"), ("get", "secrets"),
                           ("patch", "trainingjobs.flotilla.dev")):
        assert not can_i(AGENT, ns, verb, resource, "default"), f"agent may {verb} {resource}"
    # And a real attempt with an agent token is refused by the API server.
    token = kubectl("create", "token", AGENT, "-n", ns, "--duration=10m").stdout.strip()
    r = kubectl("--token", token, "delete", "pod", "anything", "-n", "default", check=False)
    assert r.returncode != 0 and "forbidden" in r.stderr.lower(), r.stderr
    # The operator: pods yes, and patching a job (its checkpoint requests are annotations on the job; RBAC
    # cannot tell an annotation from the spec in a patch), but not nodes, secrets or deleting anything of users.
    assert can_i(OP, ns, "create", "pods", "default") and can_i(OP, ns, "delete", "pods", "default")
    assert can_i(OP, ns, "patch", "trainingjobs.flotilla.dev", "default")
    for verb, resource in (("delete", "nodes"), ("patch", "nodes"), ("get", "secrets"),
                           ("delete", "trainingjobs.flotilla.dev"), ("delete", "deployments.apps"),
                           ("update", "leases.coordination.k8s.io")):
        assert not can_i(OP, ns, verb, resource, "default"), f"operator may {verb} {resource}"
    # The controller: cordon and taint nodes, list pods (the GPU map), but never change pods or read secrets.
    assert can_i(CTL, ns, "patch", "nodes", "default")
    for verb, resource in (("delete", "pods"), ("create", "pods"), ("get", "secrets"), ("delete", "nodes")):
        assert not can_i(CTL, ns, verb, resource, "default"), f"controller may {verb} {resource}"


def test_the_controller_acts_with_its_own_serviceaccount(release, namespace, tmp_path, log_dir):
    if not (ROOT / "src" / "flotilla" / "commands" / "controller.py").exists():
        pytest.skip("flotilla controller is not in this tree yet")
    import httpx

    from flotilla.testing.services import free_port, wait_for_port

    admin = secrets.token_hex(16)
    (tmp_path / "tokens").write_text(f"{admin},admin,e2e\n")
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(CTL, release, tmp_path / "controller.kubeconfig")),
           "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", "FLOTILLA_DATA": str(tmp_path)}
    log = log_dir / "chart-controller-rbac.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flotilla.cli", "controller", "--port", str(port),
                                 "--tokens-file", str(tmp_path / "tokens")], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
    node = items("nodes", "default", "nvidia.com/gpu.present=true")[0]["metadata"]["name"]
    try:
        from e2e.test_operator import job_manifest

        kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("ctl-job"))
        wait_for_port(port, timeout=30)
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {admin}"})
        wait_for("controller ready", lambda: api.get("/readyz").status_code == 200, timeout=30)
        # list/watch: the job is mirrored.
        wait_for("job mirrored", lambda: any(j.get("name") == "ctl-job" for j in api.get("/v1/jobs").json()["items"]))
        # patch trainingjobs: a checkpoint request lands as the annotation.
        assert api.post(f"/v1/jobs/{namespace}/ctl-job/checkpoint", json={"reason": "e2e"}).status_code == 202
        request = get("trainingjob", "ctl-job", namespace)["metadata"]["annotations"]["flotilla.dev/checkpoint-request"]
        assert json.loads(request)["reason"] == "e2e"
        # patch nodes (cordon), then nodes + nodes/status (uncordon, clear taint, healthy condition).
        assert api.post(f"/v1/nodes/{node}/drain", json={"reason": "e2e"}).status_code == 202
        assert get("node", node, "")["spec"].get("unschedulable") is True
        assert api.post(f"/v1/nodes/{node}/return-to-service", json={"reason": "e2e"}).status_code < 300
        back = get("node", node, "")
        assert not back["spec"].get("unschedulable")
        assert {c["type"]: c["status"] for c in back["status"]["conditions"]}.get("FlotillaGPUHealthy") == "True"
        assert permission_errors(log) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        kubectl("uncordon", node, check=False)


def test_the_controller_may_apply_spec_plan_but_not_status_nor_recreate_a_deleted_object(release, namespace, tmp_path):
    """One writer per field, enforced by RBAC: the controller's ServiceAccount server-side applies a
    ServingDeployment's spec.plan, may not write its status, and cannot bring back a deleted one."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from flotilla.controller.actions import ClusterActionError
    from flotilla.controller.kube import KubeActions

    api = config.new_client_from_config(str(kubeconfig_for(CTL, release, tmp_path / "controller.kubeconfig")))
    kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "servingdeployment-chat.yaml"))
    plan = {"prefillReplicas": 1, "decodeReplicas": 3, "prefillGPUsPerInstance": 1, "decodeGPUsPerInstance": 1,
            "predictedGoodput": 7.5, "reason": "e2e", "time": "2027-01-15T08:00:00Z"}
    fields = {"metadata": {"annotations": {"flotilla.dev/observed": '{"requestsPerSecond": 6.0}'}},
              "spec": {"plan": plan}}
    actions = KubeActions(api)
    actions.apply("servingdeployments", namespace, "chat", fields)
    sd = get("servingdeployment", "chat", namespace)
    assert sd["spec"]["plan"] == plan and sd["metadata"]["annotations"]["flotilla.dev/observed"]
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            "flotilla.dev", "v1alpha1", namespace, "servingdeployments", "chat", {"status": {"phase": "Ready"}})
    assert refused.value.status == 403
    kubectl("delete", "servingdeployment", "chat", "-n", namespace, "--wait=true", "--timeout=30s")
    with pytest.raises(ClusterActionError):
        actions.apply("servingdeployments", namespace, "chat", fields)
    assert get("servingdeployment", "chat", namespace) is None


def test_of_two_operator_replicas_exactly_one_acts_and_the_other_takes_over(release, namespace, tmp_path, log_dir,
                                                                           monkeypatch):
    from e2e.test_operator import job_manifest

    kubeconfig = kubeconfig_for(OP, release, tmp_path / "operator.kubeconfig")
    logs = [log_dir / "chart-leader-a.log", log_dir / "chart-leader-b.log"]
    for log in logs:
        log.write_text("")
    a = start_operator(kubeconfig, logs[0], release, monkeypatch)
    b = None
    try:
        first = wait_for("a leader", lambda: leader_in(logs[0]), timeout=30)
        b = start_operator(kubeconfig, logs[1], release, monkeypatch)
        wait_for("b waiting", lambda: "waiting for lease" in logs[1].read_text(), timeout=30)
        transitions = lease(release).get("leaseTransitions", 0)
        kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("under-a", min_gpus=1, max_gpus=1))
        wait_for("under-a Running", lambda: (get("trainingjob", "under-a", namespace) or {})
                 .get("status", {}).get("phase") == "Running", timeout=60)
        # Only a acts: b has not started its reconcile loop nor written anything.
        assert lease(release)["holderIdentity"] == first
        assert leader_in(logs[1]) is None and "reconcile loop started" not in logs[1].read_text()
        assert "reconcile loop started" in logs[0].read_text()

        a.stop(signal.SIGKILL)  # no release: b must wait the lease out
        second = wait_for("b takes over", lambda: leader_in(logs[1]), timeout=LEASE_SECONDS * 3)
        assert second != first and lease(release)["holderIdentity"] == second
        assert lease(release)["leaseTransitions"] == transitions + 1
        kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("under-b", min_gpus=1, max_gpus=1))
        wait_for("under-b Running", lambda: (get("trainingjob", "under-b", namespace) or {})
                 .get("status", {}).get("phase") == "Running", timeout=60)
        assert permission_errors(logs[0]) == permission_errors(logs[1]) == []
    finally:
        a.stop()
        if b:
            b.stop()
        kubectl("delete", "trainingjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)


def release_objects(ns: str) -> list[str]:
    """Every object of any listable kind, anywhere, labelled as part of the release."""
    kinds = kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    r = kubectl("get", ",".join(kinds), "-A", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o",
                "jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}{'\\n'}{end}", check=False)
    return [line for line in r.stdout.splitlines() if f"/{ns}/" in line or line.split("/")[1] == ""]


def test_upgrade_and_uninstall_leave_no_orphans(release):
    ns = release
    chart = str(ROOT / "charts" / "flotilla")
    tokens = get("secret", f"{FULL}-tokens", ns)["data"]
    certificate = get("secret", f"{CTL}-tls", ns)["data"]
    helm("upgrade", RELEASE, chart, "-n", ns, "--reuse-values", "--set", "operator.replicas=3")
    assert get("deployment", OP, ns)["spec"]["replicas"] == 3
    assert get("secret", f"{FULL}-tokens", ns)["data"] == tokens, "an upgrade must keep the API tokens"
    assert get("secret", f"{CTL}-tls", ns)["data"] == certificate, "an upgrade must keep the CA agents trust"
    # Turning a component off removes its objects.
    helm("upgrade", RELEASE, chart, "-n", ns, "--reuse-values", "--set", "agent.enabled=false")
    assert get("daemonset", AGENT, ns) is None and get("serviceaccount", AGENT, ns) is None
    wait_for("agent pods gone", lambda: not items("pods", ns, "app.kubernetes.io/component=agent"))
    assert json.loads(helm("history", RELEASE, "-n", ns, "-o", "json").stdout)[-1]["revision"] == 3

    helm("uninstall", RELEASE, "-n", ns, "--wait")
    try:
        wait_for("no release objects left", lambda: not release_objects(ns), timeout=90)
    except AssertionError:
        assert release_objects(ns) == []  # names the orphans
    for kind, name in (("clusterrole", OP), ("clusterrole", CTL), ("clusterrolebinding", OP),
                       ("clusterrolebinding", CTL), ("clusterrole", f"{FULL}-stats-poster")):
        assert get(kind, name, "") is None
    assert get("lease", OP, ns) is None
    # CRDs stay, by Helm's rule for crds/: deleting them would delete every TrainingJob in the cluster.
    assert get("crd", "trainingjobs.flotilla.dev", "") is not None


def test_queues_from_values_are_created_updated_and_removed():
    if not (ROOT / "charts" / "flotilla" / "crds" / "queues.flotilla.dev.yaml").exists():
        pytest.skip("the Queue CRD is not in the chart's crds/ yet")
    ns, release, s = f"flotilla-q-{uuid.uuid4().hex[:6]}", "flq", uuid.uuid4().hex[:6]
    dept, a, b = f"dept-{s}", f"a-{s}", f"b-{s}"
    only_queues = [*NOT_PULLED, "--set", "operator.enabled=false,agent.enabled=false,controller.enabled=false"]
    queues = ["--set", f"queues[0].name={dept},queues[0].nominal=16,queues[0].borrowingLimit=0",
              "--set", f"queues[1].name={a},queues[1].nominal=8,queues[1].parent={dept},queues[1].weight=2",
              "--set", f"queues[2].name={b},queues[2].nominal=8,queues[2].parent={dept},queues[2].lendingLimit=4,"
                       f"queues[2].namespaces={{{ns}}}"]
    kubectl("create", "namespace", ns)
    chart = str(ROOT / "charts" / "flotilla")
    try:
        helm("install", release, chart, "-n", ns, *only_queues, *queues)
        got = {q["metadata"]["name"]: q["spec"] for q in json.loads(kubectl("get", "queues", "-o", "json").stdout)["items"]}
        assert got[dept]["resources"] == [{"name": "nvidia.com/gpu", "nominal": 16, "borrowingLimit": 0}]
        assert got[a]["parent"] == dept and got[a]["weight"] == 2
        assert got[b]["resources"][0]["lendingLimit"] == 4 and got[b]["namespaces"] == [ns]
        # A lending limit above the nominal is refused before anything is applied, the field named.
        r = helm("upgrade", release, chart, "-n", ns, *only_queues, *queues, "--set", "queues[2].lendingLimit=9",
                 check=False)
        assert r.returncode != 0 and "queues[2].lendingLimit (9) must be <= queues[2].nominal (8)" in r.stderr
        # Dropping a queue from the list deletes it; the others stay.
        helm("upgrade", release, chart, "-n", ns, *only_queues, *queues[:4])
        names = {q["metadata"]["name"] for q in json.loads(kubectl("get", "queues", "-o", "json").stdout)["items"]}
        assert {dept, a} <= names and b not in names
        helm("uninstall", release, "-n", ns, "--wait")
        assert kubectl("get", "queue", dept, check=False).returncode != 0  # the release's queues go with it
    finally:
        helm("uninstall", release, "-n", ns, "--wait", check=False)
        kubectl("delete", "queue", dept, a, b, "--ignore-not-found", check=False)
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
