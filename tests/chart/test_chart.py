"""The Helm chart: lint and render for the defaults and for each option; bad values refused by the schema."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.chart.conftest import CHART, ROOT, run_helm

OP, CTL, AGENT = "rel-flotilla-operator", "rel-flotilla-controller", "rel-flotilla-agent"

# Each option the chart offers, as --set arguments; all of them must lint and render.
OPTIONS = {
    "defaults": [],
    "redis": ["--set", "redis.url=redis://redis:6379/0"],
    "redis-secret": ["--set", "redis.existingSecret=redis-auth"],
    "postgresql": ["--set", "controller.database.url=postgresql+psycopg://u:p@db/flotilla"],
    "postgresql-secret": ["--set", "controller.database.existingSecret=db-auth,controller.database.existingSecretKey=dsn"],
    "no-persistence": ["--set", "controller.persistence.enabled=false"],
    "keep-pvc": ["--set", "controller.persistence.keepOnUninstall=true,controller.persistence.storageClass=fast"],
    "existing-tokens": ["--set", "apiTokens.existingSecret=my-tokens"],
    "service-monitor": ["--set", "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.labels.release=prom"],
    "single-operator": ["--set", "operator.replicas=1,operator.leaderElection.enabled=false"],
    "watch-namespaces": ["--set", "operator.watchNamespaces={team-a,team-b}"],
    "token-review": ["--set", "controller.tokenReview.enabled=true,controller.tokenReview.admins={alice}"],
    "shared-ingest": ["--set", "controller.ingestAuth=shared"],
    "shared-ingest-plain-http": ["--set", "controller.ingestAuth=shared,controller.tls.enabled=false"],
    "stats-posters": ["--set", "controller.statsPosters={serving/router,gw/gateway}"],
    "existing-tls": ["--set", "controller.tls.existingSecret=my-cert"],
    "redis-tokenreview": ["--set", "redis.url=redis://redis:6379/0,agent.tokenExpirationSeconds=600"],
    "host-driver": ["--set", "agent.nvml.hostDriverPath=/run/nvidia/driver/usr/lib64,agent.nvml.runtimeClassName=nvidia"],
    "registry": ["--set", "image.registry=registry.example.com/flotilla/,image.tag=1.2.3"],
    "service-nodeport": ["--set", "controller.service.type=NodePort"],
    "operator-only": ["--set", "controller.enabled=false,agent.enabled=false"],
    "no-agent": ["--set", "agent.enabled=false"],
    "pool-policy": ["--set", "operator.pool.holdDownSeconds=60,operator.pool.borrowGuaranteed=true,"
                             "operator.pool.forecastHeadroom=0"],
    "baseline-policy": ["--set", "operator.policy=fifo-gang"],
    "no-pool": ["--set", "operator.pool.enabled=false"],
    "queues": ["--set", "queues[0].name=research,queues[0].nominal=16,queues[1].name=team-a,queues[1].nominal=8,"
                        "queues[1].parent=research,queues[1].namespaces={team-a},queues[1].weight=2"],
    "agent-step-port-dcgm": ["--set", "agent.stepPort=19477,agent.source=dcgm,"
                                      "agent.dcgm.url=http://localhost:9400/metrics,"
                                      "agent.stepAllowCIDRs={10.244.0.0/16,fd00:10:244::/56}"],
}


def container(objects, kind, name) -> dict:
    return objects[(kind, name)]["spec"]["template"]["spec"]["containers"][0]


def env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def rules(objects, kind, name) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role/ClusterRole grants."""
    return {(g, r, v) for rule in objects[(kind, name)]["rules"]
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def triples(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


def test_chart_crds_are_the_repository_crds():
    repo = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert repo and chart == repo, "charts/flotilla/crds/ differs from crds/: cp crds/*.yaml charts/flotilla/crds/"


@pytest.mark.parametrize("option", OPTIONS)
def test_lint(helm, option):
    r = run_helm(helm, "lint", "--strict", str(CHART), *OPTIONS[option])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_renders_secure_pods(render, option):
    objects = render(*OPTIONS[option])
    workloads = [o for (kind, _), o in objects.items() if kind in ("Deployment", "DaemonSet")]
    assert workloads
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        # Each pod runs as its own component's ServiceAccount.
        assert pod["serviceAccountName"] == w["metadata"]["name"]


def test_defaults(render):
    o = render()
    assert {k for k, _ in o} == {"ServiceAccount", "Secret", "PersistentVolumeClaim", "ClusterRole", "ClusterRoleBinding",
                                  "Role", "RoleBinding", "Lease", "Service", "Deployment", "DaemonSet", "ConfigMap"}
    assert ("Secret", f"{CTL}-tls") in o and ("ClusterRole", "rel-flotilla-stats-poster") in o
    # Operator: two replicas behind the chart's own Lease, a liveness probe that works while waiting.
    dep = o[("Deployment", OP)]
    assert dep["spec"]["replicas"] == 2
    args = container(o, "Deployment", OP)["args"]
    assert {"--leader-elect", f"--lease-name={OP}", "--lease-namespace=flotilla-system"} <= set(args)
    assert container(o, "Deployment", OP)["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ("Lease", OP) in o
    # Controller: SQLite on the PVC, tokens from the chart's Secret, probes on its endpoints.
    ctl = container(o, "Deployment", CTL)
    assert env(ctl)["FLOTILLA_DATA"] == "/var/lib/flotilla"
    volumes = {v["name"]: v for v in o[("Deployment", CTL)]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == CTL
    assert volumes["tokens"]["secret"]["secretName"] == "rel-flotilla-tokens"
    assert (ctl["livenessProbe"]["httpGet"]["path"], ctl["readinessProbe"]["httpGet"]["path"]) == ("/healthz", "/readyz")
    assert all(ctl[p]["httpGet"]["scheme"] == "HTTPS" for p in ("livenessProbe", "readinessProbe", "startupProbe"))
    assert o[("Service", CTL)]["spec"]["ports"][0] == {"name": "https", "port": 8080, "targetPort": "https"}
    # Production ingest auth: node-bound agent tokens, checked by TokenReview; HTTPS with the chart's certificate.
    assert {"--ingest-auth=tokenreview", "--token-audience=flotilla-controller",
            "--agent-service-accounts=flotilla-system/rel-flotilla-agent", "--tls-cert-file=/etc/flotilla/tls/tls.crt",
            "--tls-key-file=/etc/flotilla/tls/tls.key"} <= set(ctl["args"])
    assert volumes["tls"]["secret"]["secretName"] == f"{CTL}-tls"
    tokens = o[("Secret", "rel-flotilla-tokens")]["stringData"]
    lines = tokens["tokens"].split()
    assert [line.split(",")[1:] for line in lines] == [["admin", "admin"], ["ingest", "agent"], ["read", "metrics"]]
    assert [line.split(",")[0] for line in lines] == [tokens["admin-token"], tokens["agent-token"], tokens["metrics-token"]]
    assert len(set(tokens[k] for k in ("admin-token", "agent-token", "metrics-token"))) == 3
    # Agent: GPU nodes only, tolerates GPU and unhealthy taints, no API token, publishes to the controller.
    ds = o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {t["key"] for t in ds["tolerations"]} == {"nvidia.com/gpu", "flotilla.dev/unhealthy"}
    assert all(t["operator"] == "Exists" and "effect" not in t for t in ds["tolerations"])
    assert ds["automountServiceAccountToken"] is False
    agent = container(o, "DaemonSet", AGENT)
    assert {"--controller-url=https://rel-flotilla-controller.flotilla-system.svc:8080",
            "--token-file=/var/run/secrets/flotilla/token", "--ca-file=/var/run/secrets/flotilla/ca.crt"} <= set(agent["args"])
    # The agent's token: projected, bound to its pod (so to its node), made for the controller, short-lived.
    credentials = {v["name"]: v for v in ds["volumes"]}["credentials"]["projected"]["sources"]
    assert credentials == [
        {"serviceAccountToken": {"audience": "flotilla-controller", "expirationSeconds": 3600, "path": "token"}},
        {"secret": {"name": f"{CTL}-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
    assert {"name": "credentials", "mountPath": "/var/run/secrets/flotilla", "readOnly": True} in agent["volumeMounts"]
    assert env(agent)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env(agent)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert o[("ServiceAccount", AGENT)]["automountServiceAccountToken"] is False


def test_the_agent_runs_on_the_nodes_network_and_workers_are_pointed_at_its_step_port(render):
    for option, port in (("defaults", 9477), ("agent-step-port-dcgm", 19477)):
        o = render(*OPTIONS[option])
        ds = o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]
        assert ds["hostNetwork"] is True and ds["dnsPolicy"] == "ClusterFirstWithHostNet"
        agent = ds["containers"][0]
        # hostNetwork, and nothing more: no privileged, no added capability, no host PID/IPC, non-root.
        assert "privileged" not in agent["securityContext"] and agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert not ds.get("hostPID") and not ds.get("hostIPC") and ds["securityContext"]["runAsNonRoot"] is True
        assert agent["ports"] == [{"name": "step-time", "containerPort": port, "protocol": "UDP"}]
        assert env(agent)["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        assert {f"--step-port={port}", "--step-bind=$(HOST_IP)"} <= set(agent["args"])
        assert f"--agent-port={port}" in container(o, "Deployment", OP)["args"]
    assert "--dcgm-url=http://$(HOST_IP):9400/metrics" in container(render(), "DaemonSet", AGENT)["args"]
    args = container(render(*OPTIONS["agent-step-port-dcgm"]), "DaemonSet", AGENT)["args"]
    assert {"--source=dcgm", "--dcgm-url=http://localhost:9400/metrics"} <= set(args)
    assert [a for a in args if a.startswith("--step-allow=")] == ["--step-allow=10.244.0.0/16",
                                                                  "--step-allow=fd00:10:244::/56"]
    assert not [a for a in container(render(), "DaemonSet", AGENT)["args"] if a.startswith("--step-allow")]


def test_rbac_is_exactly_what_each_component_uses(render):
    o = render()
    # From src/flotilla/operator: kopf watches, status patches, checkpoint requests (annotations on the job),
    # pods, server-side-applied Deployments and training jobs' rendezvous Services, Events (created, then read and
    # patched to count repeats).
    assert rules(o, "ClusterRole", OP) == (
        triples("flotilla.dev", ["trainingjobs", "servingdeployments"], ["list", "watch"])
        | triples("flotilla.dev", ["trainingjobs"], ["patch"])
        | triples("flotilla.dev", ["trainingjobs/status", "servingdeployments/status"], ["patch"])
        | triples("flotilla.dev", ["queues"], ["list", "watch"])  # teams' queues: read, and their status written
        | triples("flotilla.dev", ["queues/status"], ["patch"])
        | triples("", ["nodes"], ["list", "watch"])
        | triples("", ["pods"], ["get", "list", "watch", "create", "delete"])
        | triples("apps", ["deployments"], ["list", "watch", "create", "patch"])
        | triples("", ["services"], ["create", "patch"])  # rendezvous (training) and endpoints (serving), server-side applied
        | triples("inference.networking.k8s.io", ["inferencepools"], ["create", "patch"])
        | triples("", ["events"], ["create", "get", "patch"])
        | triples("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"]))
    lease_role = o[("Role", f"{OP}-leader-election")]
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "resourceNames": [OP], "verbs": ["get", "update"]}]
    # From the controller: mirror (list/watch), checkpoint requests, spec edits and spec.plan applies (patch; never
    # create, never status), cordon/taint/condition, an Event on a Node whose health it changes, and the serving
    # pods' places for the console's GPU map (list only).
    assert rules(o, "ClusterRole", CTL) == (
        triples("flotilla.dev", ["trainingjobs", "servingdeployments"], ["get", "list", "watch", "patch"])
        | triples("flotilla.dev", ["queues"], ["get", "list", "watch"])  # mirrored for /v1/queues, never written
        | triples("", ["nodes"], ["get", "list", "watch", "patch"])
        | triples("", ["nodes/status"], ["patch"])
        | triples("", ["events"], ["create", "get", "patch"])
        | triples("", ["pods"], ["list"])  # the serving engines it scrapes
        | triples("authentication.k8s.io", ["tokenreviews"], ["create"])
        | triples("authorization.k8s.io", ["subjectaccessreviews"], ["create"]))
    # Posting serving statistics: the (virtual) subresource the controller's SubjectAccessReview asks about.
    assert rules(o, "ClusterRole", "rel-flotilla-stats-poster") == {("flotilla.dev", "servingdeployments/stats", "update")}
    # Every binding names the SA of its own component; nothing is bound to the agent.
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for (k, name), b in o.items():
            if k == kind:
                assert [(s["name"], s["namespace"]) for s in b["subjects"]] == [(OP if OP in name else CTL,
                                                                                  "flotilla-system")]
                assert b["roleRef"]["name"] == name


def test_redis(render):
    o = render(*OPTIONS["redis"])
    for kind, name in (("Deployment", CTL), ("DaemonSet", AGENT)):
        c = container(o, kind, name)
        assert env(c)["REDIS_URL"] == "redis://redis:6379/0" and "--redis-url=$(REDIS_URL)" in c["args"]
    agent = container(o, "DaemonSet", AGENT)
    assert not any(a.startswith("--controller-url") or a.startswith("--ca-file") for a in agent["args"])
    # Stream entries carry the agent's node-bound token (tokenreview is the default).
    assert "--token-file=/var/run/secrets/flotilla/token" in agent["args"]
    volumes = {v["name"]: v for v in o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]["volumes"]}
    assert [list(s) for s in volumes["credentials"]["projected"]["sources"]] == [["serviceAccountToken"]]
    secret = env(container(render(*OPTIONS["redis-secret"]), "DaemonSet", AGENT))["REDIS_URL"]
    assert secret == {"secretKeyRef": {"name": "redis-auth", "key": "url"}}


def test_postgresql_replaces_the_pvc(render):
    for option, want in (("postgresql", "postgresql+psycopg://u:p@db/flotilla"),
                         ("postgresql-secret", {"secretKeyRef": {"name": "db-auth", "key": "dsn"}})):
        o = render(*OPTIONS[option])
        c = container(o, "Deployment", CTL)
        assert env(c)["FLOTILLA_DB_URL"] == want and "--db-url=$(FLOTILLA_DB_URL)" in c["args"]
        assert not any(k == "PersistentVolumeClaim" for k, _ in o)


def test_persistence_options(render):
    o = render(*OPTIONS["no-persistence"])
    assert not any(k == "PersistentVolumeClaim" for k, _ in o)
    volumes = {v["name"]: v for v in o[("Deployment", CTL)]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    pvc = render(*OPTIONS["keep-pvc"])[("PersistentVolumeClaim", CTL)]
    assert pvc["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert pvc["spec"]["storageClassName"] == "fast"


def test_existing_token_secret(render):
    o = render(*OPTIONS["existing-tokens"])
    assert [name for k, name in o if k == "Secret"] == [f"{CTL}-tls"]  # the certificate only
    ctl_volumes = {v["name"]: v for v in o[("Deployment", CTL)]["spec"]["template"]["spec"]["volumes"]}
    assert ctl_volumes["tokens"]["secret"]["secretName"] == "my-tokens"
    o = render(*OPTIONS["existing-tokens"], "--set", "controller.ingestAuth=shared")
    agent_volumes = {v["name"]: v for v in o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]["volumes"]}
    assert agent_volumes["credentials"]["projected"]["sources"][0]["secret"]["name"] == "my-tokens"


def test_service_monitor_scrapes_with_the_read_token(render):
    sm = render(*OPTIONS["service-monitor"])[("ServiceMonitor", CTL)]
    assert sm["metadata"]["labels"]["release"] == "prom"
    endpoint = sm["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("https", "/metrics", "https")
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": f"{CTL}-tls", "key": "ca.crt"}},
                                     "serverName": f"{CTL}.flotilla-system.svc"}
    assert endpoint["authorization"]["credentials"] == {"name": "rel-flotilla-tokens", "key": "metrics-token"}


def test_the_operators_metrics_port_is_served_and_scraped(render):
    o = render(*OPTIONS["service-monitor"])
    c = container(o, "Deployment", OP)
    assert "--metrics-port=8082" in c["args"]
    assert {"name": "metrics", "containerPort": 8082} in c["ports"]
    svc = o[("Service", f"{OP}-metrics")]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8082, "targetPort": "metrics"}]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "8082",
                                              "prometheus.io/path": "/metrics"}
    assert svc["spec"]["selector"] == o[("Deployment", OP)]["spec"]["selector"]["matchLabels"]
    sm = o[("ServiceMonitor", OP)]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and "authorization" not in sm["spec"]["endpoints"][0]
    off = render("--set", "operator.metricsPort=0")
    assert "--metrics-port=0" in container(off, "Deployment", OP)["args"]
    assert ("Service", f"{OP}-metrics") not in off
    only = render("--set", "controller.enabled=false,agent.enabled=false,metrics.serviceMonitor.enabled=true")
    assert ("ServiceMonitor", OP) in only and ("ServiceMonitor", CTL) not in only


def test_single_operator_without_election(render):
    o = render(*OPTIONS["single-operator"])
    assert o[("Deployment", OP)]["spec"]["replicas"] == 1
    assert not any(k in ("Lease", "Role", "RoleBinding") for k, _ in o)
    assert "--leader-elect" not in container(o, "Deployment", OP)["args"]


def test_the_unified_pool_policy_reaches_the_operator_as_a_file_it_accepts(render):
    import yaml

    from flotilla.pool import PoolPolicy

    def pool(o):
        args = container(o, "Deployment", OP)["args"]
        cm = o.get(("ConfigMap", f"{OP}-pool"))
        return args, (PoolPolicy.from_mapping(yaml.safe_load(cm["data"]["policy.yaml"])) if cm else None)

    args, policy = pool(render())
    assert "--policy=elastic-deadline" in args and "--pool-policy=/etc/flotilla/pool/policy.yaml" in args
    assert policy == PoolPolicy()
    spec = render()[("Deployment", OP)]["spec"]["template"]["spec"]
    assert {"name": "pool-policy", "configMap": {"name": f"{OP}-pool"}} in spec["volumes"]
    assert {"name": "pool-policy", "mountPath": "/etc/flotilla/pool", "readOnly": True} in \
        spec["containers"][0]["volumeMounts"]
    _, policy = pool(render(*OPTIONS["pool-policy"]))
    assert policy == PoolPolicy(forecast_headroom=0.0, hold_down_seconds=60, borrow_guaranteed=True)
    changed = render(*OPTIONS["pool-policy"])[("Deployment", OP)]["spec"]["template"]["metadata"]["annotations"]
    assert changed["checksum/pool-policy"] != render()[("Deployment", OP)]["spec"]["template"]["metadata"][
        "annotations"]["checksum/pool-policy"]  # a new policy rolls the operator, which reads it at start
    for option in ("baseline-policy", "no-pool"):
        args, policy = pool(render(*OPTIONS[option]))
        assert policy is None and "--no-pool" in args and not any(a.startswith("--pool-policy") for a in args)


def test_component_options(render):
    args = container(render(*OPTIONS["watch-namespaces"]), "Deployment", OP)["args"]
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]

    o = render(*OPTIONS["token-review"])
    assert ("authentication.k8s.io", "tokenreviews", "create") in rules(o, "ClusterRole", CTL)
    assert "--tokenreview-admins=alice" in container(o, "Deployment", CTL)["args"]

    o = render(*OPTIONS["host-driver"])
    pod = o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"name": "host-driver", "hostPath": {"path": "/run/nvidia/driver/usr/lib64", "type": "Directory"}} in pod["volumes"]
    assert env(pod["containers"][0])["LD_LIBRARY_PATH"] == "/host-driver"

    o = render(*OPTIONS["registry"])
    assert container(o, "Deployment", OP)["image"] == "registry.example.com/flotilla/flotilla-operator:1.2.3"
    assert container(o, "DaemonSet", AGENT)["image"] == "registry.example.com/flotilla/flotilla-agent:1.2.3"

    assert render(*OPTIONS["service-nodeport"])[("Service", CTL)]["spec"]["type"] == "NodePort"

    o = render(*OPTIONS["operator-only"])
    assert {name for _, name in o} == {OP, f"{OP}-leader-election", f"{OP}-pool", f"{OP}-metrics"}


# Bad values and the message `helm install` gives for each.
INVALID = [
    (["--set", "operator.replica=3"], "at '/operator': additional properties 'replica' not allowed"),
    (["--set", "operator.replicas=-1"], "at '/operator/replicas': minimum: got -1, want 0"),
    (["--set", "operator.policy=best"], "at '/operator/policy': value must be one of 'elastic-deadline', 'fifo-gang'"),
    (["--set", "operator.pool.holdDownSeconds=-1"], "at '/operator/pool/holdDownSeconds'"),
    (["--set", "operator.pool.hold=1"], "at '/operator/pool': additional properties 'hold' not allowed"),
    (["--set", "operator.leaderElection.leaseDurationSeconds=1"], "at '/operator/leaderElection/leaseDurationSeconds'"),
    (["--set", "operator.watchNamespaces={Team_A}"], "at '/operator/watchNamespaces/0'"),
    (["--set", "agent.source=gpu"], "at '/agent/source': value must be one of 'dcgm', 'nvml', 'sim', 'auto'"),
    (["--set", "agent.stepPort=80"], "at '/agent/stepPort': minimum: got 80"),
    (["--set", "agent.dcgm.url=localhost:9400"], "at '/agent/dcgm/url'"),
    (["--set", "agent.stepAllowCIDRs={pods}"], "at '/agent/stepAllowCIDRs/0'"),
    (["--set", "agent.intervalSeconds=0"], "at '/agent/intervalSeconds'"),
    (["--set", "agent.nvml.hostDriverPath=usr/lib"], "at '/agent/nvml/hostDriverPath'"),
    (["--set-string", "controller.port=http"], "at '/controller/port': got string, want integer"),
    (["--set", "controller.service.type=Ingress"], "at '/controller/service/type'"),
    (["--set", "controller.persistence.size=lots"], "at '/controller/persistence/size'"),
    (["--set", "controller.database.url=mysql://db"], "at '/controller/database/url'"),
    (["--set", "redis.url=localhost:6379"], "at '/redis/url'"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
    (["--set", "metrics.serviceMonitor.interval=soon"], "at '/metrics/serviceMonitor/interval'"),
    # Across fields: said by the chart's own checks.
    (["--set", "operator.leaderElection.enabled=false"],
     "operator.replicas > 1 needs operator.leaderElection.enabled=true"),
    (["--set", "controller.enabled=false"], "agent.enabled needs controller.enabled or redis.url"),
    (["--set", "controller.tokenReview.enabled=true"], "controller.tokenReview.enabled needs controller.tokenReview.admins"),
    (["--set", "controller.ingestAuth=open"], "at '/controller/ingestAuth'"),
    (["--set", "controller.statsPosters={router}"], "at '/controller/statsPosters/0'"),
    (["--set", "agent.tokenExpirationSeconds=60"], "at '/agent/tokenExpirationSeconds'"),
    (["--set", "controller.ingestAuth=shared,controller.statsPosters={serving/router}"],
     "controller.statsPosters needs controller.ingestAuth=tokenreview"),
    (["--set", "controller.enabled=false,agent.enabled=false,operator.metricsPort=0,metrics.serviceMonitor.enabled=true"],
     "metrics.serviceMonitor.enabled needs controller.enabled or operator.metricsPort"),
    (["--set", "operator.metricsPort=70000"], "at '/operator/metricsPort'"),
    (["--set", "queues[0].name=a,queues[0].nominal=-1"], "at '/queues/0/nominal'"),
    (["--set", "queues[0].name=Team_A,queues[0].nominal=1"], "at '/queues/0/name'"),
    (["--set", "queues[0].name=a,queues[0].nominal=1,queues[0].weight=0"], "at '/queues/0/weight'"),
    (["--set", "queues[0].name=a"], "at '/queues/0'"),  # nominal is required
    (["--set", "queues[0].name=a,queues[0].nominal=1,queues[0].quota=2"], "at '/queues/0'"),
    (["--set", "queues[0].name=a,queues[0].nominal=4,queues[0].lendingLimit=6"],
     "queues[0].lendingLimit (6) must be <= queues[0].nominal (4)"),
    (["--set", "queues[0].name=a,queues[0].nominal=1,queues[1].name=a,queues[1].nominal=2"],
     'queues[1].name: queue "a" is listed twice'),
    (["--set", "queues[0].name=a,queues[0].nominal=1,queues[0].parent=a"],
     'queues[0].parent: queue "a" cannot be its own parent'),
]


@pytest.mark.parametrize("args, message", INVALID, ids=[" ".join(a[1:]) for a, _ in INVALID])
def test_invalid_values_are_refused_with_the_field_named(helm, args, message):
    r = run_helm(helm, "template", "rel", str(CHART), *args)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


def test_schema_covers_every_default_value():
    """additionalProperties is false throughout, so every key in values.yaml must be in the schema."""
    import yaml

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v, s, path):
        if isinstance(v, dict) and s.get("properties") is not None:
            for key, sub in v.items():
                assert key in s["properties"], f"values.yaml {path}{key} is not in values.schema.json"
                walk(sub, s["properties"][key], f"{path}{key}.")

    walk(values, schema, "")


def test_ingest_auth_and_tls_options(render):
    # shared: the development mode; the agent presents the chart's shared agent token, no review RBAC.
    o = render(*OPTIONS["shared-ingest"])
    ctl = container(o, "Deployment", CTL)
    assert "--ingest-auth=shared" in ctl["args"] and not any(a.startswith("--agent-service-accounts") for a in ctl["args"])
    assert not rules(o, "ClusterRole", CTL) & {("authentication.k8s.io", "tokenreviews", "create"),
                                               ("authorization.k8s.io", "subjectaccessreviews", "create")}
    assert ("ClusterRole", "rel-flotilla-stats-poster") not in o
    sources = {v["name"]: v for v in o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]["volumes"]}["credentials"]
    assert sources["projected"]["sources"][0] == {"secret": {"name": "rel-flotilla-tokens",
                                                             "items": [{"key": "agent-token", "path": "token"}]}}
    # plain HTTP: no certificate anywhere, agents given no CA.
    o = render(*OPTIONS["shared-ingest-plain-http"])
    assert ("Secret", f"{CTL}-tls") not in o
    ctl = container(o, "Deployment", CTL)
    assert not any(a.startswith("--tls-") for a in ctl["args"]) and ctl["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    agent = container(o, "DaemonSet", AGENT)
    assert "--controller-url=http://rel-flotilla-controller.flotilla-system.svc:8080" in agent["args"]
    assert not any(a.startswith("--ca-file") for a in agent["args"])
    # statistics posters: bound to the stats-poster ClusterRole.
    binding = render(*OPTIONS["stats-posters"])[("ClusterRoleBinding", "rel-flotilla-stats-poster")]
    assert binding["roleRef"]["name"] == "rel-flotilla-stats-poster"
    assert [(s["kind"], s["namespace"], s["name"]) for s in binding["subjects"]] == [
        ("ServiceAccount", "serving", "router"), ("ServiceAccount", "gw", "gateway")]
    # a user-supplied certificate: no chart-made Secret; controller and agents use the named one.
    o = render(*OPTIONS["existing-tls"])
    assert ("Secret", f"{CTL}-tls") not in o
    ctl_volumes = {v["name"]: v for v in o[("Deployment", CTL)]["spec"]["template"]["spec"]["volumes"]}
    assert ctl_volumes["tls"]["secret"]["secretName"] == "my-cert"
    agent_volumes = {v["name"]: v for v in o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]["volumes"]}
    assert agent_volumes["credentials"]["projected"]["sources"][1]["secret"]["name"] == "my-cert"
    # Redis with tokenreview: the token's lifetime as set.
    o = render(*OPTIONS["redis-tokenreview"])
    agent_volumes = {v["name"]: v for v in o[("DaemonSet", AGENT)]["spec"]["template"]["spec"]["volumes"]}
    assert agent_volumes["credentials"]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] == 600


def test_the_chart_made_certificate_is_signed_by_its_ca_for_the_service_names(render, tmp_path):
    import base64
    import subprocess

    data = render()[("Secret", f"{CTL}-tls")]["data"]
    for key in ("tls.crt", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(data[key]))
    r = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    names = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, check=True).stdout
    for name in (f"DNS:{CTL}.flotilla-system.svc", f"DNS:{CTL}.flotilla-system.svc.cluster.local", "DNS:localhost",
                 "IP Address:127.0.0.1"):
        assert name in names


def test_queues_from_values(render, tmp_path):
    values = tmp_path / "queues.yaml"
    values.write_text(yaml.safe_dump({"queues": [
        {"name": "research", "nominal": 32, "borrowingLimit": 0, "lendingLimit": 0},
        {"name": "team-a", "nominal": 16, "parent": "research", "namespaces": ["team-a", "team-a-dev"], "weight": 2.5},
        {"name": "team-b", "nominal": 0, "parent": "research", "borrowingLimit": 8}]}))
    o = render("--values", str(values))
    queues = {name: obj for (kind, name), obj in o.items() if kind == "Queue"}
    assert sorted(queues) == ["research", "team-a", "team-b"]
    assert all(q["apiVersion"] == "flotilla.dev/v1alpha1" and "namespace" not in q["metadata"] for q in queues.values())
    assert queues["research"]["spec"] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 32, "borrowingLimit": 0,
                                                         "lendingLimit": 0}]}
    assert queues["team-a"]["spec"] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 16}], "weight": 2.5,
                                        "parent": "research", "namespaces": ["team-a", "team-a-dev"]}
    assert queues["team-b"]["spec"] == {"resources": [{"name": "nvidia.com/gpu", "nominal": 0, "borrowingLimit": 8}],
                                        "parent": "research"}
    assert not any(kind == "Queue" for kind, _ in render())  # none by default
