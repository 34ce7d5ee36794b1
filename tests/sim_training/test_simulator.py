"""The training simulator on hand-computed timelines, and the `flotilla simulate` command."""

import json

import pytest

from flotilla.allocation import ScalingCurve, policies
from flotilla.cli import main
from flotilla.sim.training import make_nodes, simulate
from flotilla.sim.training_trace import TraceJob, generate, write_csv

LINEAR = ScalingCurve.of({1: 1.0, 4: 4.0})


def tj(job_id, submit, steps, deadline, restore=10.0):
    return TraceJob(job_id, submit, steps, requested_gpus=1, min_gpus=1, max_gpus=4, gpus_per_worker=1,
                    deadline=deadline, curve=LINEAR, restore_seconds=restore)


def test_elastic_shrinks_for_an_arrival_and_grows_back_paying_restores():
    # a runs alone on 4 GPUs. At t=100 (400 of 800 steps done) b arrives needing 200 steps by 320:
    # 1 GPU does it with 20 s to spare (a fresh job pays no restore; admission keeps half a 10 s restore in
    # hand). a shrinks to 3 (restore until 110) and finishes its
    # 400 steps at 110 + 400/3 = 243.3. b has then done 143.3; growing to 4 (10 s restore, 14.2 s) beats
    # staying on 1 (56.7 s): it finishes at 267.5.
    trace = [tj("a", 0, 800, 1000), tj("b", 100, 200, 320)]
    r = simulate(trace, 4, policies.get("elastic-deadline"))
    assert (r.deadlines_met, r.admitted, r.rejected, r.rescales, r.guarantees_missed) == (2, 2, 0, 2, 0)
    assert r.avg_jct_s == pytest.approx((243.3333 + 167.5) / 2)
    # GPU-seconds held (restores included): a 400 + 3 x 143.3, b 143.3 + 4 x 24.2 = 1070 over 4 GPUs x 267.5 s.
    assert r.utilisation == pytest.approx(1.0)
    # Re-planned at each arrival and completion, and when a restore ends (a at 110, b at 253.3).
    assert [(round(t, 1), g) for t, g, _ in r.timeline] == [(0, 4), (100, 4), (110, 4), (243.3, 4), (253.3, 4),
                                                            (267.5, 0)]


def test_fifo_gang_runs_each_job_at_min_gpus_in_order():
    trace = [tj("a", 0, 800, 1000), tj("b", 100, 200, 299)]
    r = simulate(trace, 4, policies.get("fifo-gang"))
    # a: 800 s on 1 GPU. b: starts at 100 on a free GPU, finishes at 300, one second late.
    assert (r.deadlines_met, r.rescales) == (1, 0)
    assert r.avg_jct_s == pytest.approx((800 + 200) / 2)


def test_rejected_job_never_runs_and_counts_as_missed():
    trace = [tj("a", 0, 100, 1000), tj("impossible", 0, 10_000, 100)]
    r = simulate(trace, 4, policies.get("elastic-deadline"))
    assert (r.jobs, r.admitted, r.rejected, r.deadlines_met, r.deadline_ratio) == (2, 1, 1, 1, 0.5)


def test_job_that_can_never_fit_is_reported_unfinished():
    huge = TraceJob("huge", 0, 100, requested_gpus=8, min_gpus=8, max_gpus=8, gpus_per_worker=1,
                    deadline=1000, curve=LINEAR)
    r = simulate([huge], 4, policies.get("fifo-gang"))
    assert (r.unfinished, r.deadlines_met) == (1, 0)


def test_make_nodes():
    node_list = make_nodes(20)
    assert [n.total_gpus for n in node_list] == [8, 8, 4]
    assert {n.labels["flotilla.dev/rack"] for n in node_list} == {"rack-000"}


def test_simulate_command_json_and_plot(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    assert main(["simulate", "--generate", "30", "--gpus", "16", "--out", str(trace), "--seed", "4"]) == 0
    png = tmp_path / "alloc.png"
    assert main(["simulate", "--trace", str(trace), "--gpus", "16", "--policy", "elastic-deadline",
                 "--policy", "edf-fixed", "--json", "--plot", str(png)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary) == {"elastic-deadline", "edf-fixed"}
    assert summary["edf-fixed"]["jobs"] == 30
    assert 0 <= summary["elastic-deadline"]["deadline_ratio"] <= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_command_rejects_unknown_policy(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    write_csv(generate(5, 8, seed=1), trace)
    assert main(["simulate", "--trace", str(trace), "--gpus", "8", "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
