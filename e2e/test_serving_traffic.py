"""Serving that traffic goes through, on a real API server.

`kubectl apply` of a ServingDeployment gives Services, an InferencePool (validated by the API server
against the Gateway API Inference Extension's own CRD) and `status.endpoint`; engine doubles (they stand in
for vLLM; flotilla.testing.serving_pods plays the kubelet and kube-proxy) answer OpenAI completions through the decode
Service, each decode instance calling a prefill instance first. guidellm sends load through the endpoint;
the controller scrapes the engines' vLLM metrics; when the load triples, a re-plan follows within two
intervals, and the unified pool borrows GPUs from a TrainingJob through a checkpoint.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.kube import (
    ROOT,
    SimulatedWorkersProcess,
    apply,
    controller_api,
    get,
    items,
    kubectl,
    wait_for,
    wait_for_gpus_free_outside,
)
from flotilla.testing.serving_pods import ServingKubelet, wait_healthy
from flotilla.testing.services import free_port, stop_process

OPERATOR_ARGS = ("--pool-policy", str(Path(__file__).with_name("pool-policy.yaml")))
INTERVAL = 5  # the planner's interval
# The Gateway API Inference Extension release the CRDs come from (e2e/build-binaries.sh pins it).
GIE_VERSION = os.environ.get("GIE_VERSION") or re.search(
    r"GIE_VERSION=\$\{GIE_VERSION:-(v[0-9.]+)\}", (ROOT / "e2e" / "build-binaries.sh").read_text()).group(1)
SCRAPE = 2  # the controller's scrape interval
RATE = 5.0  # requests/s, then three times as many
PROMPT, OUTPUT = 512, 128
PHASE_S = 45  # seconds of load at each rate
JOB_MAX = 30  # of the local cluster's 32 GPUs: serving holds 2 at the low load, 0 free; more must be borrowed


@pytest.fixture(scope="module")
def controller(log_dir, tmp_path_factory):
    with controller_api(log_dir, tmp_path_factory.mktemp("traffic-controller"), "--scrape-interval", str(SCRAPE),
                        "--scale-down-after", "600", "--peak-memory", "600") as api:
        yield api


@pytest.fixture(scope="module")
def guidellm(tmp_path_factory):
    """guidellm's executable, and a tokenizer it can load offline: whitespace words, as the engine counts."""
    exe = subprocess.run([str(ROOT / "e2e" / "loadgen.sh")], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    tok = tmp_path_factory.mktemp("tokenizer")
    # Every whitespace-separated word is one token, "w" (its unknown token, not a special one, so that a decoded
    # prompt keeps one word per token): guidellm's synthetic prompts of N tokens are then N words.
    (tok / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": {"w": 0}, "unk_token": "w"}}))
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "model_max_length": 100000}))
    return exe, tok


class Load:
    """One guidellm process: a constant rate through the endpoint for `seconds`, then the next rate."""

    def __init__(self, guidellm, target: str, rates: list[float], seconds: float, log_path: Path):
        exe, tok = guidellm
        self.log_path = log_path
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen(
            [exe, "run", "--backend", f"kind=openai_http,target={target},model=opt-13b,request_format=/v1/completions",
             "--profile", f"kind=constant,rate={rates[0]}", "--override", "profile.rate",
             ",".join(str(r) for r in rates), "--constraint", f"kind=max_duration,seconds={seconds}",
             "--data", f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}",
             "--tokenizer", f"kind=huggingface_auto,model={tok}",
             "--output", f"kind=json,path={log_path.with_suffix('.json')}", "--disable-console-interactive"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=log_path.parent, start_new_session=True,
            # one worker process: guidellm's default of ten takes a minute to start on a small machine
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                 "GUIDELLM__MAX_WORKER_PROCESSES": "1"})

    def started(self, rate: float) -> bool:
        """guidellm has started sending at `rate` (its log says so)."""
        return f"Starting benchmark for strategy: constant@{rate:.2f}" in self.log_path.read_text(errors="replace")

    def stop(self):
        stop_process(self.proc, group=True)  # guidellm's worker processes too
        self.log.close()


PROMPT_TOKENS = "vllm:prompt_tokens_total"


def engine_counter(kubelet: ServingKubelet, role: str, name: str) -> float:
    """One of vLLM's counters, summed over a role's engines."""
    total = 0.0
    for engine in kubelet.ready(role):
        try:
            text = httpx.get(f"http://{engine.address}/metrics", timeout=2).text
        except httpx.HTTPError:
            continue
        total += sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)
    return total


def chat(port: int) -> str:
    pool = lambda n: {"gpusPerInstance": 1, "template": {"spec": {"containers": [  # noqa: E731
        {"name": n, "image": "vllm/vllm-openai", "ports": [{"name": "http", "containerPort": port}]}]}}}
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ServingDeployment", "metadata": {"name": "chat"},
        "spec": {"slo": {"ttftMs": 400, "tpotMs": 100, "attainment": 0.9},
                 "workload": {"requestsPerSecond": RATE, "inputTokens": PROMPT, "outputTokens": OUTPUT},
                 "profile": {"name": "opt-13b-a100"}, "maxGPUs": 8, "endpoint": {"port": port},
                 "planner": {"mode": "auto", "intervalSeconds": INTERVAL},
                 "prefill": pool("p"), "decode": pool("d")}})


def llama_ft() -> str:
    return json.dumps({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "llama-ft"},
        "spec": {"deadlineSeconds": 86400, "totalSteps": 1_000_000,
                 "elasticity": {"minGPUs": 4, "maxGPUs": JOB_MAX, "gpusPerWorker": 1},
                 "throughput": [{"gpus": 2, "stepsPerSecond": 2.0}, {"gpus": JOB_MAX, "stepsPerSecond": 25.0}],
                 "checkpoint": {"intervalSteps": 20, "restoreSeconds": 5},
                 "template": {"spec": {"containers": [{"name": "w", "image": "busybox:1.36",
                                                       "command": ["sh", "-c", "sleep 3600"]}]}}}})


def test_traffic_through_the_endpoint_drives_the_plan_and_borrows_from_training(
        operator, controller, namespace, log_dir, guidellm):
    wait_for_gpus_free_outside(namespace)
    port = free_port()  # the engines' port in every pod (each pod binds its own 127.x address)

    def sd() -> dict:
        return (get("servingdeployment", "chat", namespace) or {}).get("status", {})

    def spec_plan() -> dict:
        return (get("servingdeployment", "chat", namespace) or {}).get("spec", {}).get("plan") or {}

    def tj() -> dict:
        return (get("trainingjob", "llama-ft", namespace) or {}).get("status", {})

    kubelet = ServingKubelet(namespace, log_dir).start()
    loads: list[Load] = []
    workers = None
    try:
        assert apply(chat(port), namespace).returncode == 0
        first = wait_for("chat Ready", lambda: (s := sd()).get("phase") == "Ready" and s, timeout=60)
        assert first["ratio"] == "1:1" and first["gpus"] == 2
        assert first["endpoint"] == f"http://chat-decode.{namespace}.svc:{port}"
        # The endpoint's objects: Services per pool, llm-d's role labels, the InferencePool.
        for role in ("prefill", "decode"):
            svc = get("service", f"chat-{role}", namespace)
            assert svc["spec"]["selector"] == {"flotilla.dev/serving": "chat", "flotilla.dev/role": role}
            assert svc["spec"]["ports"][0]["port"] == port and svc["metadata"]["labels"]["llm-d.ai/role"] == role
            assert all(p["metadata"]["labels"]["llm-d.ai/role"] == role
                       for p in items("pods", namespace, f"flotilla.dev/role={role}"))
        pool = get("inferencepool", "chat", namespace)
        assert pool is not None and first["inferencePool"] == "chat"
        assert pool["spec"]["selector"]["matchLabels"] == {"flotilla.dev/serving": "chat",
                                                           "llm-d.ai/inference-serving": "true"}
        assert pool["spec"]["targetPorts"] == [{"number": port}]
        assert pool["spec"]["endpointPickerRef"]["name"] == "chat-epp"
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"  # the CRD's default, filled in
        assert pool["spec"]["appProtocol"] == "http"  # v1.6's default (the field is new since v1.0), filled in
        crd = get("crd", "inferencepools.inference.networking.k8s.io", namespace) or {}
        assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == GIE_VERSION
        # The schema is the real one: what it refuses is refused.
        bad = {**pool, "metadata": {"name": "bad"}, "spec": {**pool["spec"], "targetPorts": []}}
        refused = kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(bad), check=False)
        assert refused.returncode != 0 and "targetPorts" in refused.stderr
        twice = {**bad, "spec": {**pool["spec"], "targetPorts": [{"number": port}, {"number": port}]}}
        refused = kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(twice), check=False)
        assert refused.returncode != 0 and "port number must be unique" in refused.stderr

        ips = [p["status"].get("podIP") for p in items("pods", namespace, "flotilla.dev/serving=chat")]
        if not all(ip and ipaddress.ip_address(ip).is_loopback for ip in ips):
            pytest.skip(f"serving pods have IPs {ips}: engines can run at pod addresses only with e2e/cluster.sh's "
                        "loopback pod CIDR")
        # One completion through the endpoint: decode, after prefill.
        wait_healthy(kubelet, {"prefill": 1, "decode": 1})
        endpoint = kubelet.url("chat-decode")
        wait_for("the decode Service's endpoints", lambda: kubelet.proxies["chat-decode"].backends, timeout=30)
        r = httpx.post(f"{endpoint}/v1/completions", json={"model": "opt-13b", "prompt": " ".join(["w"] * PROMPT),
                                                           "max_tokens": 8}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
        [prefill] = kubelet.ready("prefill")
        assert f"vllm:prompt_tokens_total{{model_name=\"opt-13b-a100-distserve\"}} {PROMPT}" in httpx.get(
            f"http://{prefill.address}/metrics").text

        # guidellm: RATE for PHASE_S seconds, then three times as much (it starts while the job does)
        load = Load(guidellm, endpoint, [RATE, 3 * RATE], PHASE_S, log_dir / f"guidellm-{namespace}.log")
        loads.append(load)
        workers = SimulatedWorkersProcess(log_dir / "simworkers-traffic.log", namespace).start()
        assert apply(llama_ft(), namespace).returncode == 0
        wait_for(f"llama-ft Running on {JOB_MAX} GPUs",
                 lambda: (s := tj()).get("phase") == "Running" and s["gpus"] == JOB_MAX, timeout=90)

        seen = wait_for("the scraped rate near the offered one",
                        lambda: 0.6 * RATE <= ((s := sd()).get("observed") or {}).get("requestsPerSecond", 0)
                        <= 1.4 * RATE and s, timeout=120)
        assert seen["ratio"] == first["ratio"] and seen["observed"]["ttftP90Ms"] > 0
        wait_for("guidellm's second benchmark", lambda: load.started(3 * RATE), timeout=PHASE_S + 60, interval=0.2)
        # When the tripled load arrives: the prefill engines' prompt tokens (one prefill per request, as it
        # arrives) over 1 s first exceed 1.8 times the base rate's; the load changed at the start of that second.
        arrivals: list[tuple[float, float]] = []

        def changed(samples: list[tuple[float, float]], value: float, per_request: float) -> float | None:
            samples.append((time.monotonic(), value))
            old = [(t, n) for t, n in samples if t <= samples[-1][0] - 1]
            if old and samples[-1][1] - old[-1][1] > 1.8 * RATE * per_request * (samples[-1][0] - old[-1][0]):
                return old[-1][0]
            return None

        tripled_at = wait_for("the tripled load's requests",
                              lambda: changed(arrivals, engine_counter(kubelet, "prefill", PROMPT_TOKENS), PROMPT),
                              timeout=60, interval=0.2)
        tripled_wall = time.time() - (time.monotonic() - tripled_at)
        up = wait_for("a bigger plan", lambda: (p := spec_plan()).get("prefillReplicas", 0)
                      + p.get("decodeReplicas", 0) > 2 and p, timeout=2 * INTERVAL + 10, interval=0.2)
        # spec.plan.time is the controller's clock when it decided (this machine's).
        replan_s = datetime.fromisoformat(up["time"].replace("Z", "+00:00")).timestamp() - tripled_wall
        print(f"re-plan {replan_s:.1f} s after the load tripled: {up['reason']}")
        # The path: a request is in a decode engine one TTFT after it arrives; the next scrape (every SCRAPE s)
        # counts it as an arrival (finished + the change in running and waiting); a window that calls for more
        # capacity is evaluated at once, not at the planner's next interval.
        assert replan_s <= 2 * INTERVAL, f"re-planned {replan_s:.1f} s after the load changed"
        decisions = controller.get("/v1/decisions", params={"kind": "plan", "object": f"{namespace}/chat"}).json()
        made = [d for d in decisions["items"] if d["actor"] == "controller"]
        assert made and made[0]["inputs"]["observed"]["requests_per_second"] > 1.4 * RATE

        shrunk = wait_for("llama-ft lends GPUs", lambda: (s := tj()).get("phase") == "Running"
                          and s["gpus"] < JOB_MAX and s.get("lentTo") and s, timeout=90)
        assert shrunk["reshards"] >= 1 and shrunk["checkpoint"]["generation"] >= 1
        ready = wait_for("chat Ready on the bigger plan, on borrowed GPUs",
                         lambda: (s := sd()).get("phase") == "Ready" and s["gpus"] > first["gpus"]
                         and s.get("borrowedFrom") and s, timeout=90)
        assert ready["borrowedFrom"] == [{"job": f"{namespace}/llama-ft", "gpus": shrunk["lentTo"][0]["gpus"]}]
        wait_healthy(kubelet, {"prefill": ready["prefillReplicas"], "decode": ready["decodeReplicas"]})
        r = httpx.post(f"{endpoint}/v1/completions", json={"model": "opt-13b", "prompt": "a b c", "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 200, r.text
    finally:
        for load in loads:
            load.stop()
        if workers is not None:
            workers.stop()
        kubelet.stop()
