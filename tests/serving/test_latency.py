"""The latency model against hand-computed values."""

import math
from statistics import NormalDist

import pytest

from flotilla.serving.latency import (colocated_capacity, decode_capacity, decode_load, prefill_capacity,
                                      prefill_miss_fraction)
from flotilla.serving.profile import DecodeFit, PrefillFit
from flotilla.serving.workload import Workload

PREFILL = PrefillFit(gpus=1, constant_ms=10.0, per_token_ms=0.1, per_token_squared_ms=1e-4)
DECODE = DecodeFit(gpus=1, constant_ms=10.0, per_request_ms=1.0, per_context_token_ms=0.0, kv_cache_tokens=10**6)


def test_prefill_batch_time():
    # 10 + 0.1 * (100 + 200) + 1e-4 * (100^2 + 200^2) = 10 + 30 + 5
    assert PREFILL.batch_ms([100, 200]) == pytest.approx(45.0)


def test_decode_step_time():
    fit = DecodeFit(gpus=1, constant_ms=20.0, per_request_ms=0.5, per_context_token_ms=0.001, kv_cache_tokens=1)
    assert fit.step_ms(4, 1000) == pytest.approx(20.0 + 2.0 + 1.0)


def test_prefill_alone_takes_its_batch_time():
    workload = Workload(1.0, (100, 300), (2, 2))
    # no load: TTFT = constant + own work: 10 + 0.1*100 + 1e-4*100^2 = 21 ms; the 300 prompt takes 49 ms
    assert prefill_miss_fraction(PREFILL, workload, 0.0, 30.0) == 0.5
    assert prefill_miss_fraction(PREFILL, workload, 0.0, 50.0) == 0.0
    assert prefill_miss_fraction(PREFILL, workload, 0.0, 20.0) == 1.0


def test_batching_shares_the_constant_cost():
    # Every batch costs 100 ms whatever it holds: one at a time this instance would saturate at
    # 10 req/s; batched, a busy instance makes every request wait for the batch in progress (uniform
    # in 0..100 ms) and then its own 100 ms batch, so TTFT never passes 200 ms, at any load its
    # 4096-token batches keep up with (up to 81 prompts of 50 tokens per 100 ms).
    fit = PrefillFit(gpus=1, constant_ms=100.0, per_token_ms=0.0, per_token_squared_ms=0.0)
    workload = Workload(1.0, (50, 50), (2, 2))
    assert prefill_miss_fraction(fit, workload, 100.0, 200.0) < 1e-6
    # busy nearly always at 500 req/s: half of the arrivals wait more than 50 ms for the batch in progress
    assert prefill_miss_fraction(fit, workload, 500.0, 150.0) == pytest.approx(0.5, abs=0.02)
    assert prefill_miss_fraction(fit, workload, 900.0, 10_000.0) == 1.0  # 90 prompts per 100 ms: unstable
    assert prefill_capacity(fit, workload, 250.0, 0.05) > 100.0


def test_decode_batch_by_littles_law():
    workload = Workload(10.0, (1,), (11,))  # 10 decode steps per request
    load = decode_load(DECODE, workload, 10.0, miss_budget=0.05)
    # request-steps per ms = 10 * 10 / 1000 = 0.1; B = 0.1 * 10 / (1 - 0.1 * 1)
    batch = 0.1 * 10.0 / 0.9
    tail = batch + NormalDist().inv_cdf(0.95) * math.sqrt(batch)
    assert load.batch == pytest.approx(batch)
    assert load.tail_batch == pytest.approx(tail)
    assert load.tail_tpot_ms == pytest.approx(10.0 + tail)
    assert load.fits_memory
    assert decode_load(DECODE, workload, 100.0, 0.05) is None  # 100 * 10 / 1000 * 1 >= 1: unbounded


def test_decode_memory_limit_caps_capacity():
    roomy = decode_capacity(DECODE, Workload(1.0, (500,), (101,)), 200.0, 0.05)
    tight_fit = DecodeFit(gpus=1, constant_ms=10.0, per_request_ms=1.0, per_context_token_ms=0.0,
                          kv_cache_tokens=3000)  # KV pages fill as tokens come: 551 on average a request
    tight = decode_capacity(tight_fit, Workload(1.0, (500,), (101,)), 200.0, 0.05)
    assert tight < roomy
    load = decode_load(tight_fit, Workload(1.0, (500,), (101,)), tight, 0.05)
    assert load.tail_batch * (500 + 1 + 100 / 2) == pytest.approx(3000, rel=1e-4)


@pytest.mark.parametrize("ttft_ms", [150.0, 300.0, 1000.0])  # the 700-token prompt takes 129 ms
def test_prefill_capacity_is_the_edge_of_the_miss_budget(ttft_ms):
    workload = Workload(1.0, (100, 300, 700), (10, 10, 10))
    capacity = prefill_capacity(PREFILL, workload, ttft_ms, 0.05)
    assert capacity > 0
    assert prefill_miss_fraction(PREFILL, workload, capacity, ttft_ms) <= 0.05
    assert prefill_miss_fraction(PREFILL, workload, capacity * 1.01, ttft_ms) > 0.05


def test_unreachable_targets_give_zero_capacity():
    workload = Workload(1.0, (100,), (10,))
    assert prefill_capacity(PREFILL, workload, 5.0, 0.05) == 0.0  # prefill takes 21 ms
    assert decode_capacity(DECODE, workload, 9.0, 0.05) == 0.0  # a step takes >= 10 ms


def test_colocated_instance_suffers_interference():
    workload = Workload(1.0, (200, 400, 800), (50, 100, 200))
    alone_prefill = prefill_capacity(PREFILL, workload, 300.0, 0.05)
    alone_decode = decode_capacity(DECODE, workload, 40.0, 0.05)
    both = colocated_capacity(PREFILL, DECODE, workload, 300.0, 40.0, 0.05)
    assert 0 < both < min(alone_prefill, alone_decode)


def test_workload_from_means_keeps_the_means_and_reads_the_spread():
    workload = Workload.from_means(3.0, 300.0, 200.0)
    assert sum(workload.prompt_tokens) / len(workload.prompt_tokens) == pytest.approx(300.0, rel=0.03)
    assert sum(workload.output_tokens) / len(workload.output_tokens) == pytest.approx(200.0, rel=0.03)
    wide = Workload.from_means(3.0, 300.0, 200.0, p90_prompt_tokens=700.0)
    assert max(wide.prompt_tokens) > max(workload.prompt_tokens)
    with pytest.raises(ValueError, match="workload.inputTokens"):
        Workload.from_means(3.0, 0.0, 200.0)
