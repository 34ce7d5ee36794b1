"""The engine double over real HTTP: a decode instance calls a prefill instance first; vLLM's metric names."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flotilla.controller import vllm
from flotilla.testing.engine.core import OPT_13B_A100
from flotilla.testing.services import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]


def engine(role, port, *extra):
    return subprocess.Popen([sys.executable, "-m", "flotilla.testing.engine.server", "--role", role, "--port",
                             str(port), *extra], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_up(url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not up")


@pytest.fixture(scope="module")
def pd():
    p_port, d_port = free_port(), free_port()
    procs = [engine("prefill", p_port), engine("decode", d_port, "--prefill-url", f"http://127.0.0.1:{p_port}")]
    try:
        urls = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
        for u in urls:
            wait_up(u)
        yield urls
    finally:
        for p in procs:
            stop_process(p)


def metrics(url):
    return vllm.parse(httpx.get(f"{url}/metrics").text, time.time())


def test_a_completion_goes_through_prefill_then_decode_with_latencies_from_the_profile(pd):
    prefill, decode = pd
    before_p, before_d = metrics(prefill), metrics(decode)
    prompt = " ".join(["w"] * 512)
    started = time.monotonic()
    r = httpx.post(f"{decode}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 64}, timeout=60)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 512, "completion_tokens": 64, "total_tokens": 576}
    assert body["choices"][0]["text"].split() == ["tok"] * 64 and body["choices"][0]["finish_reason"] == "length"
    after_p, after_d = metrics(prefill), metrics(decode)
    # Counted once, where it finished (the decode instance); the prefill instance computed the prompt.
    assert after_d.requests - before_d.requests == 1 and after_p.requests == before_p.requests
    prompt_tokens = httpx.get(f"{prefill}/metrics").text
    assert 'vllm:prompt_tokens_total{model_name="opt-13b-a100-distserve"} 512' in prompt_tokens
    # Times from DistServe's TP1 fits: one 512-token prefill, then 63 single-request decode steps.
    a, b, c = OPT_13B_A100.fit(1).prefill
    prefill_s = (a + b * 512 + c * 512 ** 2) / 1000
    da, db, dc = OPT_13B_A100.fit(1).decode_small
    decode_s = sum(da + db * (512 + i) + dc for i in range(1, 64)) / 1000
    assert took >= prefill_s + decode_s
    ttft = after_d.histograms["vllm:time_to_first_token_seconds"]
    assert ttft["count"] - before_d.histograms["vllm:time_to_first_token_seconds"]["count"] == 1
    assert prefill_s <= ttft["sum"] - before_d.histograms["vllm:time_to_first_token_seconds"]["sum"] < prefill_s + 1.0


def test_streaming_gives_the_first_token_then_the_rest(pd):
    _, decode = pd
    with httpx.stream("POST", f"{decode}/v1/completions", json={"prompt": "a b c", "max_tokens": 5, "stream": True},
                      timeout=30) as r:
        chunks = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]" and len(chunks) == 3
    assert '"finish_reason": "length"' in chunks[1] and '"completion_tokens": 5' in chunks[1]


def test_bad_requests_name_the_field_and_a_missing_prefill_is_a_503(pd):
    _, decode = pd
    r = httpx.post(f"{decode}/v1/completions", json={"prompt": "a", "max_tokens": 0})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{decode}/v1/completions", json={"prompt": 7})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]
    # llm-d's endpoint picker names the prefill pod in a header: one that is not there fails the request
    r = httpx.post(f"{decode}/v1/completions", json={"prompt": "a b", "max_tokens": 2},
                   headers={"x-prefiller-host-port": f"127.0.0.1:{free_port()}"})
    assert r.status_code == 503 and "prefill failed" in r.json()["error"]["message"]
