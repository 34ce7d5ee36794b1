"""The streaming entry point: samples in, health decisions out.

The controller calls `HealthMonitor.observe(samples, now)` with every batch it
ingests, `now` being when the batch arrived, and at least once per interval with no
samples, so that silence is noticed. Hard signals (a hardware XID, an uncorrectable
ECC error, a GPU gone) are confirmed at once; once per `interval` of `now` the
monitor judges liveness (`flotilla.health.liveness`: by arrival, with silences that
many nodes share reported as pipeline faults in `take_pipeline_findings()`, never as
node faults), builds one frame per training job from the latest values and runs the
peer-group outlier detector and the straggler detector on it.

Agent clocks are trusted for nothing but evidence. A sample's age at arrival is
measured against its node's own clock offset (`liveness.ClockOffsets`); a sample
older than `stale_after` at arrival (a replayed backlog), or from a node whose clock offset
is not settled yet (just after a start, while a backlog is caught up), is evidence about the past:
its hard signals are still decided (broken hardware stays broken), but it feeds no
peer comparison.

Each node carries at most one active decision. A node confirmed faulty is no
longer used as a peer. Transient findings (see `metrics.Metric.transient`, lost
heartbeats, stragglers) clear by rule once the node has looked normal for
`clear_after` consecutive evaluations; everything else stays until
`release(node)` (the admin's return-to-service).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from flotilla.health.decision import HealthDecision
from flotilla.health.liveness import ClockOffsets, Liveness, PipelineFinding
from flotilla.health.metrics import BY_NAME, COMPARED, COMPARED_INDEX, HARDWARE_XIDS, NO_CHECKPOINT_XIDS
from flotilla.health.peers import PeerOutlierDetector
from flotilla.health.samples import Sample
from flotilla.health.straggler import StragglerDetector

Rank = tuple[str, int | None]

_REDUCE = {"min": min, "max": max, "mean": lambda v: sum(v) / len(v)}


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    interval: float = 1.0            # seconds between evaluations (the agents' sampling interval)
    window: int = 5                  # outlier sliding window, evaluations
    continuity: int = 5              # evaluations a machine must stay the outlier
    threshold: float = 3.0           # windowed robust z-score above which a machine is an outlier
    clip: float = 8.0                # |z| cap per evaluation, so one wild sample cannot decide alone
    stale_after: float = 3.0         # seconds a value stays usable without a newer one
    heartbeat_timeout: float = 2.5   # seconds without a heartbeat arriving that make it lost (at two evaluations)
    shared_silence_fraction: float = 0.55  # share of a scope's nodes silent together = a pipeline fault
    shared_silence_min_nodes: int = 3      # ... and at least this many (all of the cluster always counts)
    clock_window: float = 600.0      # seconds of arrivals over which each agent's clock offset is estimated
    straggler_window: int = 15       # evaluations
    straggler_continuity: int = 5
    straggler_margin: float = 0.10   # step time this much above the peers' median
    clear_after: int = 30            # evaluations a transient finding must look normal before it clears

    def __post_init__(self) -> None:
        for name in ("interval", "threshold", "clip", "stale_after", "heartbeat_timeout", "straggler_margin",
                     "shared_silence_fraction", "clock_window"):
            if not getattr(self, name) > 0:
                raise ValueError(f"monitor config field {name!r} must be positive")
        for name in ("window", "continuity", "straggler_window", "straggler_continuity", "clear_after",
                     "shared_silence_min_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"monitor config field {name!r} must be at least 1")


@dataclass(frozen=True, slots=True)
class JobFrame:
    """One evaluation's view of one job: a row of compared metrics per machine, one step time per rank."""

    job: str
    nodes: tuple[str, ...]
    values: np.ndarray                    # (len(nodes), len(COMPARED)), reduced over GPUs, NaN = missing
    ranks: tuple[Rank, ...] = ()
    step_times: np.ndarray = field(default_factory=lambda: np.empty(0))  # (len(ranks),), NaN = no new step


class _Group:
    def __init__(self, nodes: tuple[str, ...], ranks: tuple[Rank, ...], cfg: MonitorConfig) -> None:
        self.nodes, self.ranks = nodes, ranks
        self.peers = PeerOutlierDetector(len(nodes), window=cfg.window, continuity=cfg.continuity,
                                         threshold=cfg.threshold, clip=cfg.clip)
        self.stragglers = StragglerDetector(len(ranks), window=cfg.straggler_window,
                                            continuity=cfg.straggler_continuity, margin=cfg.straggler_margin)


class HealthMonitor:
    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.active: dict[str, HealthDecision] = {}
        self._calm: dict[str, int] = {}
        self._groups: dict[str, _Group] = {}
        self._last_eval = -np.inf
        self._node_job: dict[str, str | None] = {}
        self._latest: dict[str, dict[tuple[int, int | None], tuple[float, float]]] = {}
        self._new_steps: dict[Rank, float] = {}
        self._ranks: dict[str, set[Rank]] = {}
        self.domains: Mapping[str, str] = {}   # node -> topology domain, for shared silences (set by the caller)
        self.liveness = Liveness(interval=self.config.interval, timeout=self.config.heartbeat_timeout,
                                 shared_fraction=self.config.shared_silence_fraction,
                                 shared_min_nodes=self.config.shared_silence_min_nodes)
        self._clocks = ClockOffsets(self.config.clock_window, self.config.stale_after)
        self._heartbeat_ts: dict[str, float] = {}   # the agent's own time of its latest heartbeat (evidence only)
        self._pipeline: list[PipelineFinding] = []
        self._gpu_count: dict[str, float] = {}
        self._gpu_expected: dict[str, float] = {}
        self._ecc: dict[Rank, float] = {}
        self._ecc_base: dict[Rank, float] = {}

    # -- public -------------------------------------------------------------

    def observe(self, samples: Iterable[Sample], now: float) -> list[HealthDecision]:
        """Ingest samples that arrived at `now`; evaluate when an interval has passed since the last evaluation."""
        self._pipeline += self.liveness.called(now)
        out = self._ingest(samples, now)
        if now - self._last_eval >= self.config.interval:
            out += self._evaluate(now, self._frames(now))
        return out

    def observe_frames(self, frames: Sequence[JobFrame], samples: Iterable[Sample], now: float) -> list[HealthDecision]:
        """Like `observe`, for a caller that already holds the per-job frames (the fleet simulator):
        `samples` then need only carry the hard signals; every call evaluates."""
        self._pipeline += self.liveness.called(now)
        return self._ingest(samples, now) + self._evaluate(now, frames)

    def take_pipeline_findings(self) -> list[PipelineFinding]:
        """Pipeline faults opened or closed since the last call (see `flotilla.health.liveness`)."""
        out, self._pipeline = self._pipeline, []
        return out

    def release(self, node: str) -> None:
        """Return a node to service: forget its decision; counters it showed become its new baseline, and its
        heartbeat is watched again from its next one."""
        self.active.pop(node, None)
        self._calm.pop(node, None)
        self.liveness.forget(node)
        if node in self._gpu_count:
            self._gpu_expected[node] = self._gpu_count[node]
        for rank, value in self._ecc.items():
            if rank[0] == node:
                self._ecc_base[rank] = value

    # -- ingest and hard signals -------------------------------------------

    def _ingest(self, samples: Iterable[Sample], now: float) -> list[HealthDecision]:
        samples = list(samples)
        freshest: dict[str, float] = {}
        for s in samples:  # the batch's newest sample of each node first: older ones in it are then a backlog
            lag = now - s.ts
            if lag < freshest.get(s.node, np.inf):
                freshest[s.node] = lag
        for node, lag in freshest.items():
            self._clocks.update(node, now, lag)
        stale_after = self.config.stale_after
        out: list[HealthDecision] = []
        for s in samples:
            metric = BY_NAME.get(s.metric)
            if metric is None:
                continue
            self._node_job[s.node] = s.job
            if metric.kind == "hard":
                decision = self._hard(s, now)
                if decision is not None:
                    out.append(decision)
            elif self._clocks.age(s.node, now, s.ts) > stale_after:
                continue   # replayed: evidence about the past, not for comparing peers now
            elif metric.kind == "compared":
                self._latest.setdefault(s.node, {})[(COMPARED_INDEX[s.metric], s.gpu)] = (now, s.value)
            elif metric.kind == "step":
                if s.job is not None:
                    self._new_steps[(s.node, s.gpu)] = s.value
                    self._ranks.setdefault(s.job, set()).add((s.node, s.gpu))
        return out

    def _hard(self, s: Sample, now: float) -> HealthDecision | None:
        node, value = s.node, s.value
        if s.metric == "heartbeat":
            if value == 0:  # the agent stopped on purpose: its silence from now on is no fault
                self.liveness.forget(node)
            else:
                self.liveness.beat(node, now)
                self._heartbeat_ts[node] = max(s.ts, self._heartbeat_ts.get(node, s.ts))
            return None
        if s.metric == "xid":
            code = int(value)
            if code not in HARDWARE_XIDS:
                return None
            return self._confirm(s.ts, node, "fault", f"xid-{code}", {"metric": "xid", "window": 1, "score": value,
                                 "gpu": s.gpu}, checkpointable=code not in NO_CHECKPOINT_XIDS)
        if s.metric == "ecc_uncorrected":
            rank = (node, s.gpu)
            self._ecc[rank] = value
            base = self._ecc_base.get(rank, 0.0)
            if value <= base:
                return None
            return self._confirm(s.ts, node, "fault", "ecc-uncorrectable",
                                 {"metric": "ecc_uncorrected", "window": 1, "score": value - base, "gpu": s.gpu})
        # gpu_count
        self._gpu_count[node] = value
        expected = self._gpu_expected.setdefault(node, value)
        if value >= expected:
            self._gpu_expected[node] = value
            return None
        return self._confirm(s.ts, node, "fault", "gpu-lost", {"metric": "gpu_count", "window": 1,
                             "score": expected - value, "value": value, "expected": expected}, checkpointable=False)

    def _confirm(self, ts: float, node: str, kind: Literal["fault", "straggler"], reason: str, evidence: dict[str, Any],
                 *, transient: bool = False, checkpointable: bool = True) -> HealthDecision | None:
        current = self.active.get(node)
        # A node keeps one decision; only a lasting fault may replace a transient one.
        if current is not None and (transient or not current.transient):
            return None
        decision = HealthDecision(ts, node, kind, reason, evidence, self._node_job.get(node), transient, checkpointable)
        self.active[node] = decision
        self._calm[node] = 0
        return decision

    def _settle(self, ts: float, node: str, calm: bool) -> HealthDecision | None:
        """Count one evaluation of a node with an active transient decision; clear it when calm long enough."""
        self._calm[node] = self._calm[node] + 1 if calm else 0
        if self._calm[node] < self.config.clear_after:
            return None
        decision = self.active.pop(node)
        del self._calm[node]
        return HealthDecision(ts, node, decision.kind, decision.reason,
                              {**decision.evidence, "cleared_after": self.config.clear_after}, decision.job,
                              True, decision.checkpointable, "cleared")

    # -- evaluation ----------------------------------------------------------

    def _frames(self, now: float) -> list[JobFrame]:
        cutoff = now - self.config.stale_after
        members: dict[str, list[str]] = {}
        for node, job in self._node_job.items():
            if job is not None:
                members.setdefault(job, []).append(node)
        frames = []
        for job, nodes in sorted(members.items()):
            nodes.sort()
            values = np.full((len(nodes), len(COMPARED)), np.nan)
            for row, node in enumerate(nodes):
                per_metric: dict[int, list[float]] = {}
                for (k, _gpu), (ts, v) in self._latest.get(node, {}).items():
                    if ts >= cutoff:
                        per_metric.setdefault(k, []).append(v)
                for k, vs in per_metric.items():
                    values[row, k] = _REDUCE[COMPARED[k].reduce](vs)
            ranks = tuple(sorted((r for r in self._ranks.get(job, ()) if self._node_job.get(r[0]) == job),
                                 key=lambda r: (r[0], -1 if r[1] is None else r[1])))
            steps = np.array([self._new_steps.get(r, np.nan) for r in ranks])
            frames.append(JobFrame(job, tuple(nodes), values, ranks, steps))
        self._new_steps.clear()
        return frames

    def _evaluate(self, now: float, frames: Sequence[JobFrame]) -> list[HealthDecision]:
        self._last_eval = now
        out: list[HealthDecision] = []
        for frame in frames:
            out += self._evaluate_job(now, frame)
        out += self._judge_liveness(now)
        return [d for d in out if d is not None]

    def _judge_liveness(self, now: float) -> list[HealthDecision | None]:
        timeout = self.config.heartbeat_timeout
        lost, findings = self.liveness.evaluate(now, self.domains)
        self._pipeline += findings
        out: list[HealthDecision | None] = []
        for node, current in list(self.active.items()):
            if current.reason == "heartbeat-lost" and self.liveness.watched(node):
                out.append(self._settle(now, node, self.liveness.silence(node, now) <= timeout))
        for node in lost:
            silent = self.liveness.silence(node, now)
            out.append(self._confirm(now, node, "fault", "heartbeat-lost",
                                     {"metric": "heartbeat", "window": round(timeout / self.config.interval, 3),
                                      "score": round(silent, 3), "last_seen": round(now - silent, 3),
                                      "last_sample_ts": self._heartbeat_ts.get(node)},
                                     transient=True, checkpointable=False))
        return out

    def _evaluate_job(self, now: float, frame: JobFrame) -> list[HealthDecision]:
        group = self._groups.get(frame.job)
        if group is None or group.nodes != frame.nodes or group.ranks != frame.ranks:
            group = self._groups[frame.job] = _Group(frame.nodes, frame.ranks, self.config)
        out: list[HealthDecision | None] = []
        healthy = np.array([n not in self.active for n in frame.nodes], dtype=bool)
        for f in group.peers.update(frame.values, healthy):
            node = frame.nodes[f.member]
            metric = BY_NAME[f.metric]
            out.append(self._confirm(now, node, "fault", f"outlier:{f.metric}", {
                "metric": f.metric, "window": self.config.window, "score": round(f.score, 3),
                "value": f.value, "peer_median": f.peer_median, "continuity": f.streak, "peers": int(healthy.sum()),
            }, transient=metric.transient))
        if frame.ranks:
            rank_healthy = np.array([r[0] not in self.active for r in frame.ranks], dtype=bool)
            slow: dict[str, list] = {}
            for f in group.stragglers.update(frame.step_times, rank_healthy):
                slow.setdefault(frame.ranks[f.member][0], []).append(f)
            for node, findings in slow.items():
                worst = max(findings, key=lambda f: f.score)
                out.append(self._confirm(now, node, "straggler", "slow-rank", {
                    "metric": "step_time", "window": self.config.straggler_window, "score": round(worst.score, 3),
                    "value": worst.value, "peer_median": worst.peer_median, "continuity": worst.streak,
                    "gpus": sorted(-1 if frame.ranks[f.member][1] is None else frame.ranks[f.member][1]
                                   for f in findings),
                }, transient=True))
        for row, node in enumerate(frame.nodes):
            current = self.active.get(node)
            if current is None or not current.transient or current.reason == "heartbeat-lost":
                continue
            if current.kind == "straggler":
                calm = all(group.stragglers.calm(i) for i, r in enumerate(frame.ranks) if r[0] == node)
            else:
                calm = group.peers.calm(row, COMPARED_INDEX[current.evidence["metric"]])
            out.append(self._settle(now, node, calm))
        return [d for d in out if d is not None]
