"""Serving re-planning in the controller: observed statistics in, new PD plans out.

Serving pods or a router push statistics (`POST /v1/serving/{ns}/{name}/stats`, or vLLM's
Prometheus text); every `spec.planner.intervalSeconds` each auto-mode ServingDeployment's
latest window goes through its `Replanner` (hysteresis: up fast, down slowly, never on
noise). A new plan is written to the object's status (`prefillReplicas`, `decodeReplicas`,
GPUs per instance, `predictedGoodput`, `lastPlan`), where the operator, the only writer of
Deployments, picks it up; `status.observed` is refreshed every interval. The planner is the
one writer of the counts in auto mode; `fixed` mode turns all of this off. A pending
`flotilla.dev/replan-request` (the admin's "re-plan now") forces an evaluation.
Every plan change is recorded with its inputs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from flotilla.controller.actions import ClusterActionError, ClusterActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.mirror import REPLAN_REQUEST, DecisionRecord, parse_time
from flotilla.controller.store import Store
from flotilla.controller.views import iso
from flotilla.serving.replan import ObservedWindow, ReplanPolicy, Replanner
from flotilla.serving.spec import plan_from_status, plan_request

log = logging.getLogger(__name__)
PLURAL = "servingdeployments"


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
        self.policy = policy or ReplanPolicy()
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, ObservedWindow] = {}
        self._evaluated: dict[str, float] = {}
        self._replanners: dict[str, Replanner] = {}
        self._stop = threading.Event()

    def observe(self, key: str, window: ObservedWindow) -> None:
        """The latest statistics of one ServingDeployment (namespace/name)."""
        with self._lock:
            self._windows[key] = window

    def step(self) -> None:
        now = self.clock()
        for body in self.actions.list_objects(PLURAL):
            try:
                self._step_one(body, now)
            except (ValueError, ClusterActionError) as e:
                log.warning("re-plan of %s/%s failed: %s", body["metadata"].get("namespace"),
                            body["metadata"].get("name"), e)

    def _step_one(self, body: dict[str, Any], now: float) -> None:
        meta, spec, status = body["metadata"], body["spec"], body.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        planner = spec.get("planner") or {}
        if planner.get("mode", "auto") != "auto" or "prefillReplicas" not in status:
            self._replanners.pop(key, None)  # fixed mode, or the operator has not made the first plan yet
            return
        with self._lock:
            window = self._windows.get(key)
        forced = _replan_pending(meta, status)
        due = now - self._evaluated.get(key, float("-inf")) >= float(planner.get("intervalSeconds", 30))
        if window is None or not (due or forced):
            return
        self._evaluated[key] = now
        replanner = self._replanners.get(key)
        if replanner is None:
            current = plan_from_status(status)
            template = plan_request(spec)
            replanner = self._replanners[key] = Replanner(template, current, self.policy)
        decision = replanner.observe(window)
        patch: dict[str, Any] = {"observed": observed_status(window)}
        if decision.plan is not None:
            p = decision.plan
            old = (status.get("prefillReplicas"), status.get("decodeReplicas"))
            patch.update(prefillReplicas=p.prefill_replicas, decodeReplicas=p.decode_replicas,
                         prefillGPUsPerInstance=p.prefill_gpus_per_instance,
                         decodeGPUsPerInstance=p.decode_gpus_per_instance,
                         predictedGoodput=round(p.predicted_goodput, 3),
                         lastPlan={"time": iso(now), "reason": decision.reason})
            record = DecisionRecord("plan", "ServingDeployment", key, decision.reason,
                                    {"observed": asdict(window), "from": {"prefill": old[0], "decode": old[1]},
                                     "to": {"prefill": p.prefill_replicas, "decode": p.decode_replicas,
                                            "prefillGPUsPerInstance": p.prefill_gpus_per_instance,
                                            "decodeGPUsPerInstance": p.decode_gpus_per_instance},
                                     "forced": forced}, actor="controller")
            self.store.record([record])
            self.metrics.decided([record])
            log.info("%s: new plan %d:%d (%s)", key, p.prefill_replicas, p.decode_replicas, decision.reason)
        elif forced:
            patch["lastPlan"] = {"time": iso(now), "reason": f"re-plan requested: {decision.reason}"}
        self.actions.patch_status(PLURAL, meta["namespace"], meta["name"], patch)

    def run(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            try:
                self.step()
            except Exception:
                log.exception("serving re-plan pass failed")

    def stop(self) -> None:
        self._stop.set()


def _replan_pending(meta: dict[str, Any], status: dict[str, Any]) -> bool:
    """An admin's re-plan request newer than the last plan."""
    raw = (meta.get("annotations") or {}).get(REPLAN_REQUEST)
    if not raw:
        return False
    try:
        asked = parse_time(json.loads(raw).get("time"), REPLAN_REQUEST)
    except (ValueError, AttributeError):
        return False
    last = parse_time((status.get("lastPlan") or {}).get("time"), "status.lastPlan.time")
    return asked is not None and (last is None or asked > last)
