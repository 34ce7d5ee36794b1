"""One allocator run per pass with the unified pool: the arbiter's second run (the share each admitted job
would need were serving to stay as it is, `pool.arbiter._Protected`) is made only when a ServingDeployment
is short of GPUs and borrows, and the operator's actions are those of the arbiter that made it every time."""

from __future__ import annotations

from flotilla.allocation import policies
from flotilla.operator.pool import arbitrate
from flotilla.operator.reconcile import plan
from flotilla.pool import PoolPolicy, arbiter
from tests.operator_plan.builders import T0
from tests.operator_plan.test_incremental import by_key, churn
from tests.operator_plan.world import World

NOW = T0 + 600


class Counting:
    """The arbiter's allocator, counting its runs."""

    def __init__(self, inner):
        self.inner, self.runs = inner, 0

    def decide(self, snapshot):
        self.runs += 1
        return self.inner.decide(snapshot)


def eager_init(original):
    def init(self, decision, training):
        original(self, decision, training)
        self.shares()  # as before: made in every decision

    return init


def test_the_pools_second_allocator_run_only_when_serving_borrows_with_the_same_actions(monkeypatch):
    allocator, kw = policies.get("elastic-deadline"), {"pool": PoolPolicy()}
    world = World(seed=11, nodes=6)
    world.add_serving("chat")
    world.grow(allocator, NOW, 160, finished=0.2, batch=40, **kw)
    counting = Counting(arbiter._ALLOCATOR)
    monkeypatch.setattr(arbiter, "_ALLOCATOR", counting)
    lazy_init = arbiter._Protected.__init__
    runs: dict[str, list[int]] = {"lazy": [], "eager": []}
    short = []  # steps where a ServingDeployment was short of GPUs (borrowed, or said why not)
    for step in range(10):
        churn(world, step)
        if step == 5:  # a burst: serving wants 18 GPUs on a full cluster, and borrows from training
            spec = world.servings["ns/chat"]["spec"]
            world.servings["ns/chat"]["spec"] = {**spec, "maxGPUs": 20, "planner": {
                **spec["planner"], "prefillReplicas": 9, "decodeReplicas": 9}}
        results = {}
        for mode in ("eager", "lazy"):
            monkeypatch.setattr(arbiter._Protected, "__init__", eager_init(lazy_init) if mode == "eager" else lazy_init)
            counting.runs = 0
            results[mode] = plan(NOW, allocator, *world.views(), **kw)
            runs[mode].append(counting.runs)
        assert by_key(results["lazy"]) == by_key(results["eager"]), f"step {step}"
        grants = arbitrate(NOW, kw["pool"], *world.views()[:4]).serving
        if any("borrowed" in g.reason or "short" in g.reason for g in grants.values()):
            short.append(step)
        world.apply(results["lazy"])
    assert runs["eager"] == [2] * 10  # serving's forecast headroom is a claim: two runs a pass before
    assert short == [5]
    assert runs["lazy"] == [2 if step in short else 1 for step in range(10)]
