"""The check before a promise (flotilla.serving.check): a simulation of a layout's engines and router."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from flotilla.serving import search
from flotilla.serving.check import CHECK_MARGIN, CONFIRM_REQUESTS, Layout, check
from flotilla.serving.profile import Profile, ProfileError
from flotilla.serving.shipped_profiles import OPT_13B_A100
from flotilla.serving.workload import SLO, Workload
from flotilla.sim.serving_trace import generate

CHAT = Workload.from_means(1.0, 300.0, 200.0)
SLO_LOOSE = SLO(400.0, 100.0, 0.9)


def test_a_layout_meets_a_light_load_and_misses_an_overload():
    light = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 1.0, SLO_LOOSE)
    heavy = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 40.0, SLO_LOOSE)
    assert light.meets(SLO_LOOSE) and light.attainment > 0.97
    assert not heavy.meets(SLO_LOOSE) and heavy.attainment < 0.5


def test_attainment_is_joint():
    # TPOT tight enough that some requests miss it while others miss TTFT: both must be met
    slo = SLO(150.0, 35.0, 0.9)
    result = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 6.0, slo)
    assert result.attainment <= min(result.ttft_met, result.tpot_met)
    assert result.attainment < result.ttft_met and result.attainment < result.tpot_met


def test_a_pool_serves_more_than_its_instances_apart():
    # two prefill instances behind the router serve at least what twice one instance at half the rate does
    one = check(Layout((1, 1), (1, 4)), OPT_13B_A100, CHAT, 7.0, SLO(200.0, 100.0, 0.9))
    pool = check(Layout((2, 1), (1, 4)), OPT_13B_A100, CHAT, 14.0, SLO(200.0, 100.0, 0.9))
    assert pool.ttft_met >= one.ttft_met - 0.005


def test_the_decode_batch_token_cap_is_honoured():
    capped = replace(OPT_13B_A100, decode=tuple(replace(d, max_batch_tokens=4000) for d in OPT_13B_A100.decode))
    free = check(Layout((1, 2), (1, 1)), OPT_13B_A100, CHAT, 8.0, SLO_LOOSE)
    tight = check(Layout((1, 2), (1, 1)), capped, CHAT, 8.0, SLO_LOOSE)
    assert free.tpot_met > 0.95 and tight.tpot_met < free.tpot_met - 0.2


def test_chunked_prefill_protects_tpot_in_colocated_instances():
    unchunked = replace(OPT_13B_A100, chunked_prefill=False)
    slo = SLO(400.0, 40.0, 0.9)
    chunked = check(Layout(colocated=(1, 1)), OPT_13B_A100, CHAT, 3.0, slo)
    first = check(Layout(colocated=(1, 1)), unchunked, CHAT, 3.0, slo)
    assert chunked.tpot_met > first.tpot_met


def test_the_queue_router_piles_colocated_work_on_the_first_replicas():
    slo = SLO(400.0, 40.0, 0.9)
    queue = check(Layout(colocated=(4, 1)), OPT_13B_A100, CHAT, 14.0, slo, router="queue-first")
    balanced = check(Layout(colocated=(4, 1)), OPT_13B_A100, CHAT, 14.0, slo, router="queue+kv")
    assert balanced.meets(slo) and not queue.meets(slo)


def test_the_same_seed_gives_the_same_result_and_bad_input_names_the_field():
    a = check(Layout((1, 1), (2, 1)), OPT_13B_A100, CHAT, 5.0, SLO_LOOSE, seed=3)
    b = check(Layout((1, 1), (2, 1)), OPT_13B_A100, CHAT, 5.0, SLO_LOOSE, seed=3)
    assert a == b
    with pytest.raises(ValueError, match="rate"):
        check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 0.0, SLO_LOOSE)
    with pytest.raises(ValueError, match="router"):
        check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 1.0, SLO_LOOSE, router="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout"):
        Layout((1, 1), (0, 0))


def test_profiles_state_engine_limits_and_old_ones_stay_valid():
    data = OPT_13B_A100.to_dict()
    assert "maxBatchTokens" not in data["decode"][0]  # unset: the KV capacity
    data["decode"][0]["maxBatchTokens"] = 50000
    data["chunkedPrefill"] = False
    profile = Profile.from_dict(data)
    assert profile.decode_fit(1).batch_token_cap == 50000 and not profile.chunked_prefill
    assert Profile.from_dict(profile.to_dict()) == profile
    old = OPT_13B_A100.to_dict()
    del old["chunkedPrefill"]
    assert Profile.from_dict(old).chunked_prefill
    with pytest.raises(ProfileError, match="profile.chunkedPrefill"):
        Profile.from_dict({**old, "chunkedPrefill": "yes"})
    bad = OPT_13B_A100.to_dict()
    bad["decode"][1]["maxBatchTokens"] = 0
    with pytest.raises(ProfileError, match=r"profile.decode\[1\].maxBatchTokens"):
        Profile.from_dict(bad)


def test_requests_beyond_the_iteration_cap_take_turns_and_beyond_the_kv_cache_wait():
    # the same 12,000 tokens as a per-iteration cap (the admitted take turns) and as KV memory (the rest wait
    # outside the batch), at a load that fills them: waiting is what costs TPOT, so the cap costs less of it
    per_iteration = replace(OPT_13B_A100, decode=tuple(replace(d, max_batch_tokens=12000) for d in OPT_13B_A100.decode))
    memory = replace(OPT_13B_A100, decode=tuple(replace(d, kv_cache_tokens=12000) for d in OPT_13B_A100.decode))
    turns = check(Layout((1, 2), (1, 1)), per_iteration, CHAT, 5.0, SLO_LOOSE)
    wait = check(Layout((1, 2), (1, 1)), memory, CHAT, 5.0, SLO_LOOSE)
    assert turns.tpot_met > wait.tpot_met + 0.1


def test_a_two_piece_decode_fit_prices_large_batches_with_its_second_piece():
    data = OPT_13B_A100.to_dict()
    data["decode"][0].update(largeBatchFrom=95, largeBatchConstantMs=7.17, largeBatchPerRequestMs=0.158,
                             largeBatchPerContextTokenMs=0.00058)
    profile = Profile.from_dict(data)
    fit = profile.decode_fit(1)
    assert fit.step_ms(94, 30000) == OPT_13B_A100.decode_fit(1).step_ms(94, 30000)
    assert fit.step_ms(95, 30000) == pytest.approx(7.17 + 0.158 * 95 + 0.00058 * 30000)
    assert Profile.from_dict(profile.to_dict()) == profile
    slow = check(Layout(colocated=(1, 1)), OPT_13B_A100, CHAT, 6.0, SLO_LOOSE)
    fast = check(Layout(colocated=(1, 1)), replace(profile, decode=(replace(fit, large_batch_constant_ms=0.0),
                                                                    *profile.decode[1:])), CHAT, 6.0, SLO_LOOSE)
    assert fast.tpot_met >= slow.tpot_met
    del data["decode"][0]["largeBatchPerRequestMs"]
    with pytest.raises(ProfileError, match=r"profile.decode\[0\].largeBatchPerRequestMs"):
        Profile.from_dict(data)


@pytest.mark.parametrize("layout, profile, rate", [
    (Layout(colocated=(2, 1)), OPT_13B_A100, 6.0),
    (Layout(colocated=(1, 1)), replace(OPT_13B_A100, chunked_prefill=False), 3.0),
    (Layout((1, 1), (2, 1)), replace(OPT_13B_A100, decode=tuple(replace(d, max_batch_tokens=20000)
                                                                for d in OPT_13B_A100.decode)), 8.0),
])
def test_decode_steps_run_as_one_event_give_what_steps_one_by_one_give(monkeypatch, layout, profile, rate):
    import flotilla.serving.check as module

    runs = check(layout, profile, CHAT, rate, SLO_LOOSE, requests=800, router="queue-first")
    monkeypatch.setattr(module, "STEP_RUNS", False)
    steps = check(layout, profile, CHAT, rate, SLO_LOOSE, requests=800, router="queue-first")
    assert runs.attainment == pytest.approx(steps.attainment, abs=2e-3)
    assert runs.tpot_met == pytest.approx(steps.tpot_met, abs=2e-3)


def test_a_check_stops_once_its_misses_rule_a_pass_out():
    full = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 40.0, SLO_LOOSE)
    early = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 40.0, SLO_LOOSE, pass_at=0.9)
    assert not full.meets(SLO_LOOSE) and not early.meets(SLO_LOOSE) and early.stopped_early
    passing = check(Layout((1, 1), (1, 1)), OPT_13B_A100, CHAT, 1.0, SLO_LOOSE, pass_at=0.9)
    assert not passing.stopped_early and passing.meets(SLO_LOOSE)


def test_a_check_stops_once_its_last_third_rules_a_pass_out_and_decides_as_a_full_run_does():
    slo = SLO(ttft_ms=400.0, tpot_ms=60.0, attainment=0.9)
    three = Layout(colocated=(3, 1))
    # 3 colocated instances at 20 req/s, seed 3: 0.891 in all, its last third 0.762 (a queue building)
    full = check(three, OPT_13B_A100, CHAT, 20.0, slo, requests=3000, seed=3)
    assert full.attainment > 0.85 and full.last_third < slo.attainment
    whole_only = check(three, OPT_13B_A100, CHAT, 20.0, slo, requests=3000, seed=3, pass_at=0.85)
    assert not whole_only.stopped_early
    both = check(three, OPT_13B_A100, CHAT, 20.0, slo, requests=3000, seed=3, pass_at=0.85, last_third_at=0.9)
    assert both.stopped_early and not both.meets(slo)
    # the stop changes how long a failing run takes, never what is decided
    decided = set()
    for n, rate, seed in [(4, 26.0, 2), (4, 27.0, 1), (4, 27.0, 2), (3, 20.0, 1), (3, 20.0, 4)]:
        w = Workload.from_means(rate, 300.0, 200.0)
        whole = check(Layout(colocated=(n, 1)), OPT_13B_A100, w, rate, slo, requests=3000, seed=seed)
        fast = check(Layout(colocated=(n, 1)), OPT_13B_A100, w, rate, slo, requests=3000, seed=seed,
                     pass_at=slo.attainment + CHECK_MARGIN, last_third_at=slo.attainment)
        assert fast.meets(slo) == whole.meets(slo)
        decided.add(whole.meets(slo))
    assert decided == {True, False}


def test_the_queue_router_breaks_ties_at_random_and_queue_first_to_the_first():
    # behind ties-to-the-first the first colocated replica takes most of a light load; random ties spread it
    slo = SLO(400.0, 40.0, 0.9)
    first = check(Layout(colocated=(4, 1)), OPT_13B_A100, CHAT, 14.0, slo, router="queue-first")
    spread = check(Layout(colocated=(4, 1)), OPT_13B_A100, CHAT, 14.0, slo, router="queue")
    assert spread.meets(slo) and not first.meets(slo)


def test_a_random_tie_goes_to_one_of_the_least_loaded_each_alike():
    from flotilla.serving.check import _Prefill, _Sim

    sim = _Sim(Layout((5, 1), (1, 1)), OPT_13B_A100, [100] * 10, [10] * 10, "queue", seed=3)
    for engine, waiting in zip(sim.front, (1, 0, 2, 0, 0)):
        assert isinstance(engine, _Prefill)
        engine.queue.extend(range(waiting))
        engine.loads[engine.slot] = engine.waiting_load()
    picked = [sim.front.index(sim._pick(sim.front, sim.front_loads)) for _ in range(3000)]
    assert set(picked) == {1, 3, 4}
    assert all(900 < picked.count(i) < 1100 for i in (1, 3, 4))


# The sweep's engine (DistServe's OPT-13B A100 as its simulator runs it) and the planner's observed lengths
# there: the layouts below sit where docs/serving.md ("Fourth pass") measured them on the planner's samples.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from distserve_sweep import SLO_SWEEP, judge_engine_profile  # noqa: E402

_SEEN = generate("steady", "chat", 1.0, 6000.0, 1011)
OBSERVED = Workload(1.0, tuple(int(x) for x in _SEEN.prompt_tokens[:2000]),
                    tuple(int(x) for x in _SEEN.output_tokens[:2000]))


def _counting_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seeds: list[int] = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        seeds.append(kwargs["seed"])
        return check(*args, **kwargs)

    monkeypatch.setattr(search, "check", counted)
    return seeds


def test_a_layout_that_passes_one_sample_and_collapses_on_another_is_refused(monkeypatch: pytest.MonkeyPatch):
    # one colocated GPU at 6 req/s without chunked prefill: metastable (its decode batch grows until TPOT
    # collapses on some samples); its first confirming sample passes near the target
    layout, rate, profile = Layout(colocated=(1, 1)), 6.0, judge_engine_profile()
    workload = OBSERVED.at_rate(rate)
    first = check(layout, profile, workload, rate, SLO_SWEEP, requests=CONFIRM_REQUESTS, seed=1, router="queue-first")
    assert first.meets(SLO_SWEEP) and not first.clearly_meets(SLO_SWEEP)
    seeds = _counting_checks(monkeypatch)
    result = search._confirmed(layout, profile, workload, rate, SLO_SWEEP, "queue-first", seed=0)
    assert seeds == [0, 1, 2]  # screen, first confirming sample, second
    assert not result.meets(SLO_SWEEP)


def test_a_layout_clearly_above_the_target_runs_one_confirming_sample(monkeypatch: pytest.MonkeyPatch):
    layout, rate, profile = Layout((1, 2), (2, 1)), 14.0, judge_engine_profile()
    seeds = _counting_checks(monkeypatch)
    result = search._confirmed(layout, profile, OBSERVED.at_rate(rate), rate, SLO_SWEEP, "queue-first", seed=0)
    assert seeds == [0, 1]
    assert result.clearly_meets(SLO_SWEEP) and result.requests == CONFIRM_REQUESTS - int(CONFIRM_REQUESTS * 0.1)
