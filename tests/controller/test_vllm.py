"""vLLM's Prometheus metrics -> one statistics window between two scrapes."""

import pytest

from flotilla.controller import vllm


def exposition(requests, prompt_sum, output_sum, ttft_buckets, n=None, running=None, waiting=None):
    n = requests if n is None else n
    lines = [] if running is None else ["# TYPE vllm:num_requests_running gauge",
                                        f'vllm:num_requests_running{{model_name="m"}} {running}',
                                        "# TYPE vllm:num_requests_waiting gauge",
                                        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}']
    lines += ["# TYPE vllm:request_success counter",
             f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {requests * 0.75}',
             f'vllm:request_success_total{{finished_reason="length",model_name="m"}} {requests * 0.25}',
             "# TYPE vllm:request_prompt_tokens histogram",
             f'vllm:request_prompt_tokens_bucket{{le="1000.0"}} {n}', f'vllm:request_prompt_tokens_bucket{{le="+Inf"}} {n}',
             f"vllm:request_prompt_tokens_sum {prompt_sum}", f"vllm:request_prompt_tokens_count {n}",
             "# TYPE vllm:request_generation_tokens histogram",
             f'vllm:request_generation_tokens_bucket{{le="500.0"}} {n}',
             f'vllm:request_generation_tokens_bucket{{le="+Inf"}} {n}',
             f"vllm:request_generation_tokens_sum {output_sum}", f"vllm:request_generation_tokens_count {n}",
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {c}' for le, c in ttft_buckets]
    lines += ["vllm:time_to_first_token_seconds_sum 1", f"vllm:time_to_first_token_seconds_count {n}"]
    return "\n".join(lines) + "\n"


def test_two_scrapes_give_rate_lengths_and_percentiles():
    first = vllm.parse(exposition(100, 50_000, 20_000, [(0.1, 50), (0.5, 100), ("+Inf", 100)]), 1000.0)
    # 10 s later: 40 more requests, 400 prompt and 150 output tokens each; of their TTFTs,
    # 20 under 0.1 s and all 40 under 0.5 s.
    second = vllm.parse(exposition(140, 66_000, 26_000, [(0.1, 70), (0.5, 140), ("+Inf", 140)]), 1010.0)
    w = vllm.window(first, second)
    assert w.requests_per_second == pytest.approx(4.0) and w.requests == 40
    assert w.mean_prompt_tokens == pytest.approx(400.0) and w.mean_output_tokens == pytest.approx(150.0)
    # p90 of TTFT: the 36th of 40 lies 16/20 of the way through the (0.1, 0.5] bucket -> 0.42 s.
    assert w.ttft_p90_ms == pytest.approx(420.0)
    assert w.tpot_p90_ms is None and w.attainment is None


def test_the_rate_is_of_arrivals_finished_plus_those_the_engines_took_in():
    # 10 s: 40 requests finished, and the engines hold 30 more than before (12 -> 30 running, 0 -> 12
    # waiting): 70 arrived. When the load triples the finish rate lags by a request's life; this does not.
    first = vllm.parse(exposition(100, 50_000, 20_000, [(0.1, 100), ("+Inf", 100)], running=12, waiting=0), 0.0)
    second = vllm.parse(exposition(140, 66_000, 26_000, [(0.1, 140), ("+Inf", 140)], running=30, waiting=12), 10.0)
    assert vllm.window(first, second).requests_per_second == pytest.approx(7.0)
    # draining: fewer held than before, but never a negative arrival count
    drained = vllm.parse(exposition(145, 68_000, 26_750, [(0.1, 145), ("+Inf", 145)], running=0, waiting=0), 11.0)
    assert vllm.window(second, drained).requests_per_second == 0.0
    # several engines' gauges add up
    total = vllm.Scrape(0.0)
    vllm.add(total, first)
    vllm.add(total, second)
    assert total.in_engine == 12 + 42


def test_no_window_without_finished_requests_or_from_garbage():
    a = vllm.parse(exposition(100, 50_000, 20_000, [(0.1, 50), ("+Inf", 100)]), 0.0)
    assert vllm.window(a, vllm.parse(exposition(100, 50_000, 20_000, [(0.1, 50), ("+Inf", 100)]), 10.0)) is None
    with pytest.raises(ValueError):
        vllm.parse("this is { not prometheus", 0.0)
