"""Traces, the request-level simulator and the simulate-serving / serving-trace commands."""

import json
import re

import numpy as np
import pytest

from flotilla.cli import main
from flotilla.serving.planner import InstanceCapacities, Plan, instance_capacities, plan_from_capacities
from flotilla.serving.replan import ObservedWindow
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO
from flotilla.sim.serving import (PEAK_WINDOW_S, AdaptivePolicy, ServingSim, StaticPolicy, make_policy, peak_rate,
                                  simulate, workload_statistics)
from flotilla.sim.serving_trace import Trace, generate, read_csv, write_csv
from flotilla.testing.engine import OPT_13B_A100 as ENGINE_OPT_13B_A100

SLO_ = SLO(400.0, 60.0, 0.9)
ONE_AND_ONE = Plan("disaggregated", 1, 1, 1, 1, 0, 0, 0.0, 0.0, False, "test")
COLOCATED = Plan("colocated", 0, 0, 0, 0, 1, 1, 0.0, 0.0, False, "test")


def run_static(trace: Trace, layout: Plan, budget: int = 8):
    return ServingSim(trace, OPT_13B_A100, SLO_, budget, StaticPolicy("static", layout)).run()


def test_one_request_follows_the_profile_exactly():
    trace = Trace(np.array([0.0]), np.array([100]), np.array([3]))
    result = run_static(trace, ONE_AND_ONE)
    a, b, c = ENGINE_OPT_13B_A100.fits[1].prefill  # the engine double prices with the fit as first published
    prefill = a + b * 100 + c * 100 ** 2
    decode = OPT_13B_A100.decode_fit(1)
    steps = decode.step_ms(1, 101) + decode.step_ms(1, 102)  # context grows by one token a step
    transfer = 100 * ENGINE_OPT_13B_A100.kv_bytes_per_token / 25e9 * 1000  # the prompt's KV to the decode GPU
    assert result.ttft_p50_ms == pytest.approx(prefill)
    assert result.tpot_p50_ms == pytest.approx((transfer + steps) / 2)
    assert result.attainment == 1.0


def test_colocated_chunked_prefill_shares_iterations_with_the_decode_batch():
    # A long prompt arrives while the first request decodes. Colocated, it is computed in one
    # iteration together with a decode step (chunked prefill): that step takes the prompt's own work
    # longer, but not its fixed cost; disaggregated, it runs elsewhere. (It wants one token, so it
    # never joins the decode batch and its own TPOT is 0.)
    trace = Trace(np.array([0.0, 0.05]), np.array([100, 1500]), np.array([40, 1]))
    colocated = run_static(trace, COLOCATED)
    split = run_static(trace, ONE_AND_ONE)
    _, b, c = ENGINE_OPT_13B_A100.fits[1].prefill  # the engine double's fit, as first published
    own_work = b * 1500 + c * 1500 ** 2
    transfer = 100 * ENGINE_OPT_13B_A100.kv_bytes_per_token / 25e9 * 1000
    # The 99th percentile of [0, t] interpolates to 0.99 t.
    assert colocated.tpot_p99_ms - split.tpot_p99_ms == pytest.approx(0.99 * (own_work - transfer) / 39, rel=1e-6)


def test_generated_traces_are_seeded_and_have_the_asked_rate():
    a = generate("diurnal", "chat", 10.0, 600.0, seed=3)
    b = generate("diurnal", "chat", 10.0, 600.0, seed=3)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_tokens, b.output_tokens)
    assert len(a) / 600.0 == pytest.approx(10.0, rel=0.1)
    step = generate("step", "code", 10.0, 900.0, seed=1)
    middle = np.sum((step.arrival_s >= 300) & (step.arrival_s < 600))
    assert middle / np.sum(step.arrival_s < 300) == pytest.approx(3.0, rel=0.2)
    long = generate("steady", "summarise", 5.0, 300.0, seed=1)
    assert np.median(long.prompt_tokens) > 5 * np.median(generate("steady", "chat", 5.0, 300.0, 1).prompt_tokens)
    assert np.all(long.prompt_tokens + long.output_tokens <= 2048)


def test_csv_round_trip_and_errors(tmp_path):
    trace = generate("bursty", "chat", 5.0, 60.0, seed=2)
    path = tmp_path / "t.csv"
    write_csv(trace, path)
    back = read_csv(path)
    assert np.allclose(back.arrival_s, trace.arrival_s, atol=1e-6)
    assert np.array_equal(back.prompt_tokens, trace.prompt_tokens)
    bad = tmp_path / "bad.csv"
    for body, message in [("arrival_s,prompt_tokens\n0,1\n", "missing column(s) output_tokens"),
                          ("arrival_s,prompt_tokens,output_tokens\n0,10,x\n", ":2: output_tokens: not an integer"),
                          ("arrival_s,prompt_tokens,output_tokens\n1,10,5\n0.5,10,5\n", ":3: arrival_s: must be"),
                          ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", ":2: prompt_tokens: must be >= 1")]:
        bad.write_text(body)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_csv(bad)


def test_adaptive_never_holds_more_than_the_budget():
    trace = generate("step", "chat", 8.0, 600.0, seed=5)
    result = simulate(trace, OPT_13B_A100, SLO_, 5, "adaptive")
    assert result.plan_changes >= 1
    assert result.max_gpus <= 5


def test_adaptive_evaluates_a_scrape_window_between_intervals_only_when_it_calls_for_a_scale_up():
    policy = make_policy("adaptive", generate("steady", "chat", 5.0, 300.0, seed=5), SLO_, OPT_13B_A100, 8)
    assert isinstance(policy, AdaptivePolicy)

    def window(t: float, rate: float) -> ObservedWindow:
        return ObservedWindow(t, rate, 200.0, 150.0, seconds=15.0)

    first = policy.initial_plan()
    assert policy.on_window(window(15.0, 1.0)) is None  # not due, and no scale-up: not even observed
    assert len(policy.replanner._windows) == 0
    up = policy.on_window(window(45.0, 30.0))  # between intervals, short of capacity: at once
    assert up is not None and up.gpus > first.gpus
    assert policy.on_window(window(60.0, 30.0)) is None and len(policy.replanner._windows) == 1


def test_fixed_1_1_is_sized_for_the_peak_in_pairs_at_the_planners_gpus_per_role():
    trace = generate("step", "chat", 8.0, 600.0, seed=5)
    peak = peak_rate(trace, PEAK_WINDOW_S)
    caps = instance_capacities(workload_statistics(trace), SLO_, OPT_13B_A100)
    layout = plan_from_capacities(InstanceCapacities(caps.prefill, caps.decode, {}), peak, 1, 16)
    fixed = make_policy("fixed-1-1", trace, SLO_, OPT_13B_A100, 16).initial_plan()
    assert fixed.prefill_replicas == fixed.decode_replicas >= 1
    assert (fixed.prefill_gpus_per_instance, fixed.decode_gpus_per_instance) == (
        layout.prefill_gpus_per_instance, layout.decode_gpus_per_instance)
    assert fixed.predicted_goodput >= peak  # enough pairs for the peak minute...
    one_fewer = (fixed.prefill_replicas - 1) * min(caps.prefill[fixed.prefill_gpus_per_instance],
                                                   caps.decode[fixed.decode_gpus_per_instance])
    assert one_fewer < peak  # ...and no more
    # a budget too small for the peak holds as many pairs as fit
    small = make_policy("fixed-1-1", trace, SLO_, OPT_13B_A100, 3).initial_plan()
    assert small.gpus <= 3 and small.prefill_replicas == small.decode_replicas == 1


def test_cli_simulates_a_trace_and_reports_json(tmp_path, capsys):
    path = tmp_path / "t.csv"
    assert main(["serving-trace", "--arrival", "steady", "--rate", "3", "--duration", "60", "--out", str(path)]) == 0
    assert main(["simulate-serving", "--trace", str(path), "--profile", "opt-13b-a100", "--gpus", "4",
                 "--policy", "fixed-1-1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["policy"] == "fixed-1-1" and result["requests"] == len(read_csv(path))
    assert 0.0 <= result["attainment"] <= 1.0 and result["max_gpus"] == 2  # one 1:1 pair serves ~3 req/s
    assert main(["simulate-serving", "--trace", str(path), "--profile", "nope", "--gpus", "4",
                 "--policy", "adaptive"]) == 2
    assert "profile.name: unknown profile 'nope'" in capsys.readouterr().out
    inline = tmp_path / "profile.yaml"
    inline.write_text("prefill: [{gpus: 1, constantMs: 10, perTokenMs: 0.1, perTokenSquaredMs: 0}]\n"
                      "decode: [{gpus: 1, constantMs: 20, perRequestMs: 0.5, perContextTokenMs: 0.001}]\n")
    assert main(["simulate-serving", "--trace", str(path), "--profile", str(inline), "--gpus", "4",
                 "--policy", "colocated"]) == 2
    assert "profile.decode[0].kvCacheTokens: required" in capsys.readouterr().out
    inline.write_text(inline.read_text().replace("0.001}", "0.001, kvCacheTokens: 20000}"))
    assert main(["simulate-serving", "--trace", str(path), "--profile", str(inline), "--gpus", "4",
                 "--policy", "colocated"]) == 0
    assert "policy colocated:" in capsys.readouterr().out
