"""Admission keeps every guaranteed job half a restore's time of its own to spare before its deadline
(`elastic._headroom`), so that the small moves of the others' plans at each re-plan do not break a guarantee
planned with no time to spare; the guarantee itself holds to the deadline.

One GPU, one step a second: "a" is admitted and running, 1,000 steps left, deadline 1,100 s, 30 s restores.
A newcomer "b" with an earlier deadline and S steps stops "a" for S s, and "a" then pays a restore: "a"
finishes at 1,030 + S, with 70 - S s to spare.
"""

from builders import job, nodes, snapshot

from flotilla.allocation import ScalingCurve, Verdict
from flotilla.allocation.elastic import DeadlineElastic

ONE = ScalingCurve.of({1: 1.0})


def running_a(deadline: float = 1100.0, **extra):
    return job("a", 1000, deadline, max_gpus=1, curve=ONE, restore=30.0, placement={"n0": 1},
               verdict=Verdict.ADMITTED, share=1, **extra)


def newcomer(steps: int, deadline: float = 100.0, key: str = "b"):
    return job(key, steps, deadline, max_gpus=1, curve=ONE, restore=30.0, submit=1.0)


def decide(*jobs):
    return DeadlineElastic().decide(snapshot(nodes(1), *jobs, now=0.0)).jobs


def test_a_newcomer_that_leaves_an_admitted_job_its_headroom_is_admitted():
    d = decide(running_a(), newcomer(35))  # "a" would have 35 s to spare, more than its 15
    assert d["b"].verdict is Verdict.ADMITTED, d["b"].reason
    assert d["a"].guaranteed_gpus == 0 and d["a"].share == 1  # it waits for "b", and is guaranteed after


def test_a_newcomer_that_would_leave_it_less_is_rejected_and_says_why():
    # 10 s to spare (less than 15): the deadline would still be met as planned (the old rule admitted it),
    # with almost nothing in hand for the next move of any plan.
    d = decide(running_a(), newcomer(60))
    assert d["b"].verdict is Verdict.REJECTED
    assert d["b"].reason == ("rejected: admitting it would put the guarantee of a at risk: less than half a "
                             "restore's time to spare before the deadline")
    assert d["a"].guaranteed_gpus == 1 and d["a"].placement == {"n0": 1}


def test_a_newcomer_that_cannot_finish_a_restore_before_its_deadline_is_rejected():
    # Alone on the GPU it would finish 10 s before its deadline; admission keeps 15 s in hand for it too.
    d = decide(newcomer(90))
    assert d["b"].verdict is Verdict.REJECTED
    assert d["b"].reason == ("rejected: it could finish only within 15 s of its deadline (half a restore's "
                             "time), which admission keeps in hand for every guaranteed job")
    assert decide(newcomer(60))["b"].verdict is Verdict.ADMITTED  # 40 s to spare


def test_a_job_left_with_less_than_its_headroom_keeps_its_guarantee_to_the_deadline():
    # Plans moved after "a" was admitted: it now has 10 s to spare. It is still guaranteed its GPU.
    d = decide(running_a(deadline=1010.0))
    assert d["a"].guaranteed_gpus == 1 and d["a"].placement == {"n0": 1}, d["a"].reason
    assert "can no longer" not in d["a"].reason


def test_a_job_without_its_headroom_does_not_stop_newcomers_after_it():
    # "a" has 10 s to spare; a newcomer with a later deadline, which takes nothing "a" needs, is admitted.
    later = newcomer(100, deadline=1300.0, key="c")
    d = decide(running_a(deadline=1010.0), later)
    assert d["c"].verdict is Verdict.ADMITTED, d["c"].reason
    assert d["a"].guaranteed_gpus == 1
