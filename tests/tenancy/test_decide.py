"""tenancy.decide on hand-checked cases: borrowing, reclaim through checkpoints, limits, weights, the tree, serving,
missing and invalid queues, lost nodes."""

from __future__ import annotations

from dataclasses import replace

from flotilla.allocation import JobState, NodeState, ScalingCurve, Verdict
from flotilla.pool import PoolSnapshot, ServingState
from flotilla.tenancy import RESOURCE_GPU, QueueSpec, Quota, TenantDecision, decide

LINEAR = ScalingCurve.of({1: 1.0, 32: 32.0})


def nodes(n: int = 2, gpus: int = 8, lost: tuple[int, ...] = ()) -> tuple[NodeState, ...]:
    return tuple(NodeState(f"n{i}", gpus, schedulable=i not in lost) for i in range(n))


def q(name: str, nominal: int, **extra) -> QueueSpec:  # type: ignore[no-untyped-def]
    quota = Quota(nominal, extra.pop("borrowing", None), extra.pop("lending", None))
    return QueueSpec(name, {RESOURCE_GPU: quota}, **extra)


def job(key: str, queue: str, gpus_seconds: float, deadline: float, **extra) -> JobState:  # type: ignore[no-untyped-def]
    fields = dict(submit_time=0.0, total_steps=int(gpus_seconds), done_steps=0, min_gpus=1, max_gpus=16,
                  gpus_per_worker=1, curve=LINEAR, restore_seconds=10.0, checkpoint_interval_steps=100)
    fields.update(extra)
    return JobState(key=key, deadline=deadline, queue=queue, **fields)  # type: ignore[arg-type]


def running(d: TenantDecision, j: JobState) -> JobState:
    """`j` as it runs after decision `d`: its placement, verdict and share fed back."""
    jd = d.pool.jobs[j.key]
    return replace(j, placement=dict(jd.placement), verdict=jd.verdict, share=jd.share)


def gpus_of(d: TenantDecision, queue_jobs: list[str]) -> int:
    return sum(d.pool.jobs[k].gpus for k in queue_jobs)


def assert_fits(snapshot: PoolSnapshot, d: TenantDecision) -> None:
    used: dict[str, int] = {}
    for placement in [x.placement for x in d.pool.jobs.values()] + [x.placement for x in d.pool.serving.values()]:
        for node, g in placement.items():
            used[node] = used.get(node, 0) + g
    for n in snapshot.nodes:
        assert used.get(n.name, 0) <= n.usable_gpus, (n, used)


TEAMS = [q("a", 8), q("b", 8)]


def test_an_idle_queue_lends_and_the_borrower_has_no_guarantee_beyond_its_nominal() -> None:
    a = job("a/big", "a", 16 * 3000, 10_000)
    snap = PoolSnapshot(0.0, nodes(), (a,), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    assert d.pool.jobs["a/big"].gpus == 16
    assert d.pool.jobs["a/big"].guaranteed_gpus <= 8
    assert "borrows beyond its nominal" in d.pool.jobs["a/big"].reason
    assert (d.queues["a"].used, d.queues["a"].borrowed, d.queues["b"].lent) == (16, 8, 8)


def test_reclaim_shrinks_the_borrower_through_a_checkpoint_and_the_owner_is_admitted() -> None:
    a = job("a/big", "a", 16 * 3000, 10_000)
    d0 = decide(PoolSnapshot(0.0, nodes(), (a,), ()), TEAMS)
    b = job("b/deadline", "b", 8 * 900, 1200.0, submit_time=100.0)
    snap = PoolSnapshot(100.0, nodes(), (replace(running(d0, a), done_steps=1600, last_checkpoint_step=1600), b), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    owner = d.pool.jobs["b/deadline"]
    assert owner.verdict is Verdict.ADMITTED
    # b's guarantee needs 7 GPUs now; a/big shrinks for it anyway, so in the same checkpoint it gives back what b's
    # own partition would give b/deadline (its 8 GPUs): b is never slower than alone on its nominal.
    assert owner.guaranteed_gpus == 7 and owner.gpus == 8
    assert d.pool.jobs["a/big"].gpus == 8 and d.pool.jobs["a/big"].verdict is Verdict.ADMITTED
    [r] = d.reclaims
    assert (r.job, r.from_queue, r.to_queue, r.gpus) == ("a/big", "a", "b", 8)
    assert "through a checkpoint" in r.reason
    assert "tj/a/big" in d.pool.transition.shrink and "tj/b/deadline" in d.pool.transition.grow


def test_a_running_lender_does_not_take_back_for_speed_alone() -> None:
    # b's job already runs on 7 of b's 8 GPUs with its guarantee: nothing starts, so a/big keeps the GPU it borrows
    # (taking it back would cost both jobs a restore for one GPU of speed).
    a = job("a/big", "a", 16 * 3000, 10_000)
    d0 = decide(PoolSnapshot(0.0, nodes(), (a,), ()), TEAMS)
    b = job("b/deadline", "b", 8 * 900, 1200.0, submit_time=100.0, max_gpus=8)
    a_run = replace(running(d0, a), placement={"n0": 1, "n1": 8}, done_steps=1600, last_checkpoint_step=1600)
    b_run = replace(b, placement={"n0": 7}, verdict=Verdict.ADMITTED, share=7, done_steps=1400)
    snap = PoolSnapshot(300.0, nodes(), (a_run, b_run), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    assert d.reclaims == ()
    assert d.pool.jobs["a/big"].gpus == 9 and d.pool.jobs["b/deadline"].gpus == 7


def test_lowest_priority_furthest_above_its_guarantee_shrinks_first() -> None:
    hi = job("a/hi", "a", 8 * 3000, 10_000, priority=10, max_gpus=8)
    lo = job("a/lo", "a", 8 * 3000, 10_000, priority=0, max_gpus=8)
    d0 = decide(PoolSnapshot(0.0, nodes(), (hi, lo), ()), TEAMS)
    assert gpus_of(d0, ["a/hi", "a/lo"]) == 16
    b = job("b/j", "b", 4 * 900, 1000.0, max_gpus=4)
    d = decide(PoolSnapshot(10.0, nodes(), (running(d0, hi), running(d0, lo), b), ()), TEAMS)
    assert [r.job for r in d.reclaims] == ["a/lo"]
    assert d.pool.jobs["a/hi"].gpus == 8 and d.pool.jobs["b/j"].gpus == 4


def test_best_effort_work_gives_back_before_a_guaranteed_job_further_above_its_guarantee() -> None:
    g = job("a/g", "a", 10 * 3000, 10_000, max_gpus=10)
    d0 = decide(PoolSnapshot(0.0, nodes(), (g,), ()), TEAMS)
    assert d0.pool.jobs["a/g"].verdict is Verdict.ADMITTED and 0 < d0.pool.jobs["a/g"].guaranteed_gpus <= 4
    g_run = replace(running(d0, g), placement={"n0": 8, "n1": 2}, done_steps=300, last_checkpoint_step=300)
    be = job("a/be", "a", 16 * 1000, 200.0, best_effort=True, verdict=Verdict.BEST_EFFORT, placement={"n1": 4})
    b = job("b/j", "b", 4 * 900, 1000.0, max_gpus=4, submit_time=10.0)
    snap = PoolSnapshot(10.0, nodes(), (g_run, be, b), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    # a/g is 6 GPUs above its guarantee, a/be 4 above none: the job without a guarantee gives back first.
    assert [r.job for r in d.reclaims] == ["a/be"]
    assert d.pool.jobs["a/g"].gpus == 10 and d.pool.jobs["b/j"].gpus == 4
    assert d.pool.jobs["a/be"].verdict is Verdict.BEST_EFFORT and d.pool.jobs["a/be"].guaranteed_gpus == 0


def test_a_waiting_job_gets_gpus_back_from_borrowers_not_from_its_own_queues_running_jobs() -> None:
    # b runs b/g on 4 of its 8 GPUs (guaranteed fewer), a borrows the other 4. b/new waits: b's running job is
    # not expected to shrink for it while a borrows b's nominal; a gives GPUs back, as b alone would start b/new.
    a = job("a/big", "a", 16 * 3000, 10_000, placement={"n0": 8, "n1": 4}, verdict=Verdict.ADMITTED, share=8)
    g = job("b/g", "b", 4 * 1000, 10_000, max_gpus=4, placement={"n1": 4}, verdict=Verdict.ADMITTED, share=1,
            done_steps=100, last_checkpoint_step=100)
    new = job("b/new", "b", 4 * 1000, 30 * 86400.0, best_effort=True, verdict=Verdict.BEST_EFFORT, min_gpus=2,
              max_gpus=4, submit_time=50.0)
    snap = PoolSnapshot(60.0, nodes(), (a, g, new), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    assert d.pool.jobs["b/g"].gpus == 4 and d.pool.jobs["b/new"].gpus >= 2
    assert [r.job for r in d.reclaims] == ["a/big"] and d.reclaims[0].to_queue == "b"


def test_another_queues_burst_of_deadlines_cannot_take_a_queues_share() -> None:
    burst = [job(f"a/d{i}", "a", 8 * 1000, 1200.0, max_gpus=8) for i in range(4)]
    d0 = decide(PoolSnapshot(0.0, nodes(), tuple(burst), ()), TEAMS)
    admitted = [k for k, x in d0.pool.jobs.items() if x.verdict is Verdict.ADMITTED]
    assert len(admitted) == 1  # only one 8-GPU deadline fits a's nominal of 8
    assert d0.queues["a"].guaranteed <= 8
    b = job("b/d", "b", 8 * 900, 1200.0, max_gpus=8, submit_time=10.0)
    d = decide(PoolSnapshot(10.0, nodes(), tuple(running(d0, j) for j in burst) + (b,), ()), TEAMS)
    assert d.pool.jobs["b/d"].verdict is Verdict.ADMITTED and d.pool.jobs["b/d"].gpus == 8


def test_best_effort_runs_on_borrowed_gpus_without_a_guarantee() -> None:
    a = job("a/be", "a", 16 * 1000, 200.0, best_effort=True)
    d = decide(PoolSnapshot(0.0, nodes(), (a,), ()), TEAMS)
    assert d.pool.jobs["a/be"].verdict is Verdict.BEST_EFFORT and d.pool.jobs["a/be"].gpus == 16
    assert d.pool.jobs["a/be"].guaranteed_gpus == 0


def test_borrowing_and_lending_limits() -> None:
    a = job("a/big", "a", 16 * 3000, 10_000)
    small = nodes(8, 2)  # two-GPU nodes: no job is kept to whole 8-GPU nodes
    assert decide(PoolSnapshot(0.0, small, (a,), ()), [q("a", 8, borrowing=2), q("b", 8)]).pool.jobs[
        "a/big"].gpus == 10
    d = decide(PoolSnapshot(0.0, small, (a,), ()), [q("a", 8), q("b", 8, lending=4)])
    assert d.pool.jobs["a/big"].gpus == 12 and d.queues["b"].lent == 4


def test_idle_gpus_are_shared_by_weight() -> None:
    a = job("a/big", "a", 32 * 3000, 10_000, max_gpus=32, best_effort=True)
    b = job("b/big", "b", 32 * 3000, 10_000, max_gpus=32, best_effort=True)
    queues = [q("a", 4, weight=3.0), q("b", 4), q("idle", 16)]
    d = decide(PoolSnapshot(0.0, nodes(3), (a, b), ()), queues)
    assert (d.pool.jobs["a/big"].gpus, d.pool.jobs["b/big"].gpus) == (16, 8)


def test_a_parent_bounds_its_children() -> None:
    queues = [q("dept", 8, borrowing=0), q("a", 4, parent="dept"), q("b", 4, parent="dept"), q("c", 8)]
    a = job("a/big", "a", 16 * 3000, 10_000, best_effort=True)
    d = decide(PoolSnapshot(0.0, nodes(), (a,), ()), queues)
    assert d.pool.jobs["a/big"].gpus == 8  # b's idle share within dept, nothing of c's (dept may not borrow)
    d = decide(PoolSnapshot(0.0, nodes(), (a,), ()), [replace(queues[0], quotas={RESOURCE_GPU: Quota(8)}),
                                                      *queues[1:]])
    assert d.pool.jobs["a/big"].gpus == 16


def test_serving_counts_against_its_queue_and_its_burst_reclaims_borrowed_gpus() -> None:
    a = job("a/big", "a", 16 * 3000, 10_000)
    chat = ServingState("b/chat", demand_gpus=2, min_gpus=2, max_gpus=8, gpus_per_instance=2, queue="b")
    d0 = decide(PoolSnapshot(0.0, nodes(), (a,), (chat,)), TEAMS)
    # 14 GPUs are a's to use; the allocator keeps a multi-node job to whole nodes: 8.
    assert d0.pool.serving["b/chat"].gpus == 2 and d0.pool.jobs["a/big"].gpus == 8
    burst = replace(chat, demand_gpus=8, placement=dict(d0.pool.serving["b/chat"].placement))
    d = decide(PoolSnapshot(60.0, nodes(), (running(d0, a),), (burst,)), TEAMS)
    assert d.pool.serving["b/chat"].gpus == 8 and d.pool.jobs["a/big"].gpus == 8
    assert not d.reclaims  # the burst fits beside a's 8 GPUs


def test_a_serving_burst_takes_its_queues_nominal_back_from_a_borrower() -> None:
    a = job("a/big", "a", 16 * 3000, 10_000, best_effort=True)
    chat = ServingState("b/chat", demand_gpus=2, min_gpus=2, max_gpus=8, gpus_per_instance=2, queue="b")
    small = nodes(8, 2)
    d0 = decide(PoolSnapshot(0.0, small, (a,), (chat,)), TEAMS)
    assert d0.pool.serving["b/chat"].gpus == 2 and d0.pool.jobs["a/big"].gpus == 14
    burst = replace(chat, demand_gpus=8, placement=dict(d0.pool.serving["b/chat"].placement))
    snap = PoolSnapshot(60.0, small, (running(d0, a),), (burst,))
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    assert d.pool.serving["b/chat"].gpus == 8 and d.pool.jobs["a/big"].gpus == 8
    assert [(r.job, r.from_queue, r.to_queue, r.gpus) for r in d.reclaims] == [("a/big", "a", "b", 6)]


def test_a_job_naming_a_missing_queue_waits_and_one_whose_queue_was_deleted_keeps_running() -> None:
    new = job("x/new", "nope", 1000, 10_000)
    d0 = decide(PoolSnapshot(0.0, nodes(), (job("a/run", "a", 8000, 10_000, max_gpus=4),), ()), TEAMS)
    orphan = replace(running(d0, job("a/run", "a", 8000, 10_000, max_gpus=4)))
    d = decide(PoolSnapshot(10.0, nodes(), (new, orphan), ()), [q("b", 8)])
    assert d.pool.jobs["x/new"].verdict is Verdict.PENDING and "queue 'nope' does not exist" in d.pool.jobs[
        "x/new"].reason
    assert any(p.field == "spec.queue" and "x/new" in p.message for p in d.problems)
    assert d.pool.jobs["a/run"].gpus == 4  # in the implicit queue now, on what no queue's nominal covers


def test_an_invalid_queue_blocks_only_its_own_jobs() -> None:
    queues = [q("a", 4, parent="b"), q("b", 4, parent="a"), q("c", 8)]
    ja, jc = job("a/j", "a", 1000, 10_000), job("c/j", "c", 1000, 10_000, max_gpus=4)
    d = decide(PoolSnapshot(0.0, nodes(), (ja, jc), ()), queues)
    assert d.pool.jobs["a/j"].verdict is Verdict.PENDING and "not valid" in d.pool.jobs["a/j"].reason
    assert d.pool.jobs["c/j"].gpus == 4
    assert any(p.queue == "a" and p.field == "spec.parent" for p in d.problems)


def test_a_lost_node_below_the_nominals_is_reported_and_guarantees_shrink_together() -> None:
    a = job("a/j", "a", 8 * 3000, 10_000, max_gpus=8)
    b = job("b/j", "b", 8 * 3000, 10_000, max_gpus=8)
    d0 = decide(PoolSnapshot(0.0, nodes(), (a, b), ()), TEAMS)
    assert gpus_of(d0, ["a/j", "b/j"]) == 16
    snap = PoolSnapshot(10.0, nodes(lost=(1,)), (running(d0, a), running(d0, b)), ())
    d = decide(snap, TEAMS)
    assert_fits(snap, d)
    assert any("exceeds the cluster's" in p.message for p in d.problems)
    assert gpus_of(d, ["a/j", "b/j"]) == 8
    assert d.queues["a"].used <= 8 and d.queues["b"].used <= 8


def test_a_borrower_without_a_checkpoint_that_must_stop_is_told_it_loses_its_progress() -> None:
    queues = [q("a", 0), q("b", 16)]
    be = job("a/be", "a", 16 * 3000, 10_000, best_effort=True, checkpoint_interval_steps=0)
    d0 = decide(PoolSnapshot(0.0, nodes(), (be,), ()), queues)
    assert d0.pool.jobs["a/be"].gpus == 16
    owner = job("b/d", "b", 16 * 900, 1200.0, min_gpus=16, max_gpus=16)
    d = decide(PoolSnapshot(10.0, nodes(), (replace(running(d0, be), done_steps=100), owner), ()), queues)
    [r] = d.reclaims
    assert (r.job, r.gpus, r.to_queue) == ("a/be", 16, "b")
    assert "no checkpoint configured, so it loses its progress" in r.reason
    assert d.pool.jobs["a/be"].gpus == 0 and d.pool.jobs["b/d"].gpus == 16


def test_a_queue_with_a_negative_nominal_serves_nothing_and_one_over_the_cluster_still_serves() -> None:
    ja, jb = job("a/j", "a", 1000, 10_000, max_gpus=4), job("b/j", "b", 1000, 10_000, max_gpus=4)
    d = decide(PoolSnapshot(0.0, nodes(), (ja, jb), ()), [q("a", -1), q("b", 40)])
    assert d.pool.jobs["a/j"].verdict is Verdict.PENDING and "nominal must be >= 0" in d.pool.jobs["a/j"].reason
    assert d.pool.jobs["b/j"].gpus == 4
    assert any("exceeds the cluster's" in p.message for p in d.problems)
