"""Serving re-planning in the controller: observed statistics in, new PD plans out.

Serving pods or a router push statistics (`POST /v1/serving/{ns}/{name}/stats`, or vLLM's
Prometheus text); every `spec.planner.intervalSeconds` each auto-mode ServingDeployment's
latest window goes through its `Replanner` (hysteresis: up fast, down slowly, never on
noise). The controller writes two things, server-side applied as field manager
`flotilla-controller`, which owns them and nothing else:

* `spec.plan` (prefill/decode replicas, GPUs per instance, predicted goodput, reason, time): the
  planner's decision is desired state, so it lives in the spec, survives a restart of either
  component and a backup/restore, and a user's apply of other fields leaves it alone;
* the `flotilla.dev/observed` annotation: the latest window, refreshed every interval. Not in
  the spec (it is a measurement, and would bump `metadata.generation` every interval), not in
  status (the operator is status's only writer; it mirrors the annotation into `status.observed`).

The operator, the only writer of Deployments and of status, acts on spec.plan. `fixed` mode
turns all of this off. A pending `flotilla.dev/replan-request` (the admin's "re-plan now")
forces an evaluation. Every plan change is recorded with its inputs.

`_step_one` decides and returns actions (`flotilla.controller.apply`); one applier writes them. What each
Replanner remembers (its recent windows and hysteresis: up to an hour of peaks) is one of those actions,
kept in the controller's database, so that a restarted controller resumes it rather than scaling down early.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from flotilla.controller.actions import ClusterActionError, ClusterActions
from flotilla.controller.apply import Action, Applier, ApplyFields, Record, Remember
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import DecisionRecord, parse_time
from flotilla.controller.store import Store
from flotilla.resources.names import ANNOTATION_OBSERVED
from flotilla.resources.parse import iso
from flotilla.resources.names import ANNOTATION_REPLAN_REQUEST as REPLAN_REQUEST
from flotilla.serving.planner import Plan
from flotilla.serving.replan import ObservedWindow, ReplanMemory, ReplanPolicy, Replanner
from flotilla.serving.spec import plan_field, plan_request
from flotilla.serving.target import deployed

log = logging.getLogger(__name__)
PLURAL = "servingdeployments"
MEMORY = "serving-replan"  # the kind of the re-planner's memory in the controller's database


@dataclass(frozen=True)
class Remembered:
    """The re-planner's memory of one ServingDeployment, as kept in the database."""

    inputs: str  # the digest of the spec it planned from: a changed spec starts afresh
    evaluated: float  # when it last evaluated
    checked_window: float  # the time of the last window it looked at
    replanner: ReplanMemory

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "evaluated": self.evaluated, "checkedWindow": self.checked_window,
                "replanner": self.replanner.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Remembered:
        return cls(str(d["inputs"]), float(d["evaluated"]), float(d["checkedWindow"]),
                   ReplanMemory.from_dict(d["replanner"]))


def observed_status(w: ObservedWindow) -> dict[str, float]:
    out = {"requestsPerSecond": round(w.requests_per_second, 3)}
    for key, value in (("ttftP90Ms", w.ttft_p90_ms), ("tpotP90Ms", w.tpot_p90_ms), ("attainment", w.attainment)):
        if value is not None:
            out[key] = round(float(value), 4)
    return out


class ServingReplanner:
    def __init__(self, actions: ClusterActions, store: Store, metrics: ControllerMetrics,
                 policy: ReplanPolicy | None = None, clock: Callable[[], float] = time.time) -> None:
        self.actions, self.store, self.metrics = actions, store, metrics
        self.applier = Applier(store, actions, metrics)
        self.policy = policy or ReplanPolicy()
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, ObservedWindow] = {}
        self._evaluated: dict[str, float] = {}
        self._checked_window: dict[str, float] = {}  # the time of the last window looked at, by key
        self._replanners: dict[str, Replanner] = {}
        self._inputs: dict[str, str] = {}  # the spec each Replanner was made from
        self._applied: dict[str, dict[str, Any]] = {}  # the spec.plan last applied, by key
        self._recalled: dict[str, dict[str, Any]] | None = None  # what an earlier run remembered, read once
        self._stop = threading.Event()

    def observe(self, key: str, window: ObservedWindow) -> None:
        """The latest statistics of one ServingDeployment (namespace/name)."""
        with self._lock:
            self._windows[key] = window

    def step(self) -> None:
        now = self.clock()
        if self._recalled is None:
            self._recalled = self.store.recall(MEMORY)
        for body in self.actions.list_objects(PLURAL):
            try:
                self.applier.apply(self._step_one(body, now))
            except (ValueError, ClusterActionError) as e:
                log.warning("re-plan of %s/%s failed: %s", body["metadata"].get("namespace"),
                            body["metadata"].get("name"), e)

    def _step_one(self, body: dict[str, Any], now: float) -> list[Action]:
        """What to do about one ServingDeployment now (no writes: the actions for the applier)."""
        meta, spec, status = body["metadata"], body["spec"], body.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        current = deployed(spec, status)  # what the operator deploys (flotilla.serving.target)
        if (spec.get("planner") or {}).get("mode", "auto") != "auto" or current is None:
            return self._forget(key)  # fixed mode, or the operator has not made the first plan yet
        with self._lock:
            window = self._windows.get(key)
        inputs = _planning_inputs(spec)
        remembered = self._remembered(key, inputs) if key not in self._replanners else None
        if remembered is not None:  # the first pass since a restart: the timers go on from where they were
            self._evaluated.setdefault(key, remembered.evaluated)
            self._checked_window.setdefault(key, remembered.checked_window)
        forced = _replan_pending(meta, spec)
        interval = float((spec.get("planner") or {}).get("intervalSeconds", 30))
        due = now - self._evaluated.get(key, float("-inf")) >= interval
        # A window newer than the last one evaluated that calls for a scale-up goes in at once, not at the
        # next interval: waiting for the pass added up to an interval to every re-plan after a load change.
        fresh = window is not None and window.time > self._checked_window.get(key, float("-inf"))
        if window is None or not (due or forced or fresh):
            return []
        replanner = self._replanner(key, spec, current, inputs, remembered)
        self._checked_window[key] = window.time
        if not (due or forced or replanner.short_of_capacity(window)):
            return []
        self._evaluated[key] = now
        decision = replanner.observe(window)
        acts: list[Action] = [Remember(MEMORY, key, Remembered(inputs, now, window.time, replanner.memory()).to_dict())]
        plan = self._applied.get(key) or spec.get("plan")
        if decision.plan is not None:
            plan = plan_field(decision.plan, decision.reason, iso(now) or "")
            acts.append(Record(_plan_record(key, current, decision.plan, decision.reason, window, forced)))
            log.info("%s: new plan %d:%d (%s)", key, decision.plan.prefill_replicas, decision.plan.decode_replicas,
                     decision.reason)
        elif forced:
            plan = plan_field(replanner.current, f"re-plan requested: {decision.reason}", iso(now) or "")
        return [*acts, *self._write(key, meta, spec, plan, window)]

    def _forget(self, key: str) -> list[Action]:
        had = self._replanners.pop(key, None) is not None or (self._recalled or {}).pop(key, None) is not None
        self._applied.pop(key, None)
        return [Remember(MEMORY, key, None)] if had else []

    def _replanner(self, key: str, spec: dict[str, Any], current: Plan, inputs: str,
                   remembered: Remembered | None) -> Replanner:
        replanner = self._replanners.get(key)
        if replanner is None or self._inputs.get(key) != inputs:
            # new, or the user changed what plans are made from (SLO, budget, profile, ...): start
            # again from what is deployed, with the new request
            replanner = self._replanners[key] = Replanner(plan_request(spec), current, self.policy)
            self._inputs[key] = inputs
            if remembered is not None:
                replanner.resume(remembered.replanner)
            (self._recalled or {}).pop(key, None)
        return replanner

    def _write(self, key: str, meta: dict[str, Any], spec: dict[str, Any], plan: dict[str, Any] | None,
               window: ObservedWindow) -> list[Action]:
        """The apply of what the controller owns on the object, when any of it changed."""
        observed = json.dumps(observed_status(window), sort_keys=True)
        if plan == spec.get("plan") and (meta.get("annotations") or {}).get(ANNOTATION_OBSERVED) == observed:
            return []  # nothing new to write
        # Everything the controller owns, every time: server-side apply removes what its manager leaves out.
        fields: dict[str, Any] = {"metadata": {"annotations": {ANNOTATION_OBSERVED: observed}}}
        if plan:
            fields["spec"] = {"plan": plan}
            self._applied[key] = plan  # before the call: a failed apply is retried with this plan next pass
        return [ApplyFields(PLURAL, meta["namespace"], meta["name"], fields)]

    def _remembered(self, key: str, inputs: str) -> Remembered | None:
        """What an earlier run remembered about `key`, if it planned from the same spec."""
        found = (self._recalled or {}).get(key)
        if found is None:
            return None
        try:
            remembered = Remembered.from_dict(found)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("%s: the re-planner's remembered state is unreadable (%s); starting afresh", key, e)
            return None
        return remembered if remembered.inputs == inputs else None

    def run(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            try:
                self.step()
            except Exception:
                log.exception("serving re-plan pass failed")

    def stop(self) -> None:
        self._stop.set()


def _plan_record(key: str, current: Plan, p: Plan, reason: str, window: ObservedWindow, forced: bool
                 ) -> DecisionRecord:
    return DecisionRecord("plan", "ServingDeployment", key, reason,
                          {"observed": asdict(window),
                           "from": {"prefill": current.prefill_replicas, "decode": current.decode_replicas},
                           "to": {"prefill": p.prefill_replicas, "decode": p.decode_replicas,
                                  "prefillGPUsPerInstance": p.prefill_gpus_per_instance,
                                  "decodeGPUsPerInstance": p.decode_gpus_per_instance},
                           "forced": forced}, actor="controller")


def _planning_inputs(spec: dict[str, Any]) -> str:
    """The spec a plan is made from (everything but the plan itself), as a digest."""
    return hashlib.sha256(json.dumps({k: v for k, v in spec.items() if k != "plan"}, sort_keys=True).encode()
                          ).hexdigest()


def _replan_pending(meta: dict[str, Any], spec: dict[str, Any]) -> bool:
    """An admin's re-plan request newer than the last plan."""
    raw = (meta.get("annotations") or {}).get(REPLAN_REQUEST)
    if not raw:
        return False
    try:
        asked = parse_time(json.loads(raw).get("time"), REPLAN_REQUEST)
    except (ValueError, AttributeError):
        return False
    last = parse_time((spec.get("plan") or {}).get("time"), "spec.plan.time")
    return asked is not None and (last is None or asked > last)
