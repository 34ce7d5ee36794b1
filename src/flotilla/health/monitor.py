"""The streaming entry point: samples in, health decisions out.

The controller calls `HealthMonitor.observe(samples, now)` with every batch it
ingests, `now` being when the batch arrived, and at least once per interval with no
samples, so that silence is noticed. Hard signals (a hardware XID, an uncorrectable
ECC error, a GPU gone) are confirmed at once; every half `interval` of `now` the
monitor judges liveness (`flotilla.health.liveness`: by arrival, with silences that
many nodes share reported as pipeline faults in `take_pipeline_findings()`, never as
node faults), and once per `interval` it notices GPUs whose series stopped while their node's go on (a lost
GPU), builds one frame per training job from the latest values and runs the
peer-group outlier detector and the straggler detector on it.

Peers are machines doing the same work: the same job and the same `role` (the
pipeline stage, and data/tensor-parallel group where known, as workers report it;
no role = every machine of the job). A role group with fewer than three healthy
machines is compared with each machine's own recent history instead, corrected by
the job's common change. Per-rank `step_time` is compared within the ranks' role
group by a sequential test (`flotilla.health.straggler`); `sync_step_time`, the wall
time of a synchronous step, is a job-level signal and localises nothing.

Agent clocks are trusted for nothing but evidence. A sample's age at arrival is
measured against its node's own clock offset (`liveness.ClockOffsets`); a sample
older than `stale_after` at arrival (a replayed backlog), or from a node whose clock offset
is not settled yet (just after a start, while a backlog is caught up), is evidence about the past:
its hard signals are still decided (broken hardware stays broken), but it feeds no
peer comparison.

A node carries at most one active decision per fault kind (`HealthDecision.key`):
an open soft finding never masks a hard fault. A node with any active decision is
no longer used as a peer. Soft findings (outliers, stragglers) and lost heartbeats
clear by rule once the node has looked normal for `clear_after` consecutive
evaluations (a soft finding that was wrong clears); hard faults stay until
`release(node)` (the admin's return-to-service).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from flotilla.health.decision import HealthDecision, decision_key
from flotilla.health.groups import NOT_ROLES, PeerGroups
from flotilla.health.liveness import ClockOffsets, Liveness, PipelineFinding
from flotilla.health.metrics import BY_NAME, COMPARED, COMPARED_INDEX, EVENTS, HARDWARE_XIDS, NO_CHECKPOINT_XIDS
from flotilla.health.peers import PeerOutlierDetector, SelfHistory
from flotilla.health.samples import Sample
from flotilla.health.straggler import StragglerDetector
from flotilla.health.window import nanmedian0

Rank = tuple[str, int | None]
_ROLE_SHAPED = np.array([m.name not in NOT_ROLES for m in COMPARED])

_REDUCE: dict[str, Callable[[list[float]], float]] = {"min": min, "max": max,
                                                       "mean": lambda v: sum(v) / len(v)}


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    interval: float = 1.0            # seconds between evaluations (the agents' sampling interval)
    window: int = 5                  # outlier sliding window, evaluations
    continuity: int = 5              # evaluations a machine must stay the outlier
    threshold: float = 3.0           # windowed robust z-score above which a machine is an outlier
    clip: float = 8.0                # |z| cap per evaluation, so one wild sample cannot decide alone
    stale_after: float = 3.0         # seconds a value stays usable without a newer one
    heartbeat_timeout: float = 2.0   # seconds without a heartbeat arriving that make it lost (at two evaluations)
    gpu_silence: float = 1.5         # seconds a GPU's measurements may lag its node's other series before it is lost
    shared_silence_fraction: float = 0.55  # share of a scope's nodes silent together = a pipeline fault
    shared_silence_min_nodes: int = 3      # ... and at least this many (all of the cluster always counts)
    clock_window: float = 600.0      # seconds of arrivals over which each agent's clock offset is estimated
    history_span: int = 120          # evaluations of a machine's own history (groups without three peers)
    history_warmup: int = 30         # evaluations of own history before it is used
    straggler_window: int = 60       # evaluations over which a role group's step-time noise is estimated
    straggler_shift: float = 0.05    # relative slowdown the sequential test is tuned to (the CUSUM's reference)
    straggler_threshold: float = 12.0  # CUSUM level, in noise units, at which a rank is a straggler
    straggler_min_sigma: float = 0.005  # floor of the step-time noise (relative)
    clear_after: int = 30            # evaluations a soft finding must look normal before it clears
    group_window: int = 60           # evaluations of healthy behaviour a job's inferred peer groups are learned on
    group_learn_after: int = 10      # evaluations before the groups are first computed
    group_every: int = 5             # evaluations between computations (fixed when two in a row agree)
    group_gap: float = 3.0           # a gap between machines' levels, in the metric's scale, that parts groups

    def __post_init__(self) -> None:
        for name in ("interval", "threshold", "clip", "stale_after", "heartbeat_timeout", "gpu_silence",
                     "straggler_shift", "straggler_threshold", "straggler_min_sigma", "shared_silence_fraction",
                     "clock_window", "group_gap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"monitor config field {name!r} must be positive")
        for name in ("window", "continuity", "straggler_window", "clear_after", "shared_silence_min_nodes",
                     "history_span", "history_warmup", "group_window", "group_learn_after", "group_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"monitor config field {name!r} must be at least 1")


@dataclass(frozen=True, slots=True)
class JobFrame:
    """One evaluation's view of one job: a row of compared metrics per machine, one step time per rank.
    `roles` (per machine) and `rank_roles` (per rank) name the role groups; empty = one group."""

    job: str
    nodes: tuple[str, ...]
    values: np.ndarray                    # (len(nodes), len(COMPARED)), reduced over GPUs, NaN = missing
    ranks: tuple[Rank, ...] = ()
    step_times: np.ndarray = field(default_factory=lambda: np.empty(0))  # (len(ranks),), NaN = no new step
    roles: tuple[str | None, ...] = ()
    rank_roles: tuple[str | None, ...] = ()
    rank_ids: tuple[int | None, ...] = ()  # the global rank of each rank, where workers say it


def _group_ids(roles: Sequence[str | None], n: int) -> tuple[list[str | None], np.ndarray]:
    roles = list(roles) if roles else [None] * n
    names = sorted(set(roles), key=lambda r: "" if r is None else r)
    return names, np.array([names.index(r) for r in roles], dtype=np.int64)


class _Job:
    """The detectors' state for one job: one outlier detector per role group, own histories, stragglers."""

    def __init__(self, frame: JobFrame, cfg: MonitorConfig) -> None:
        self.key = (frame.nodes, frame.roles, frame.ranks, frame.rank_roles)
        self.role_names, groups = _group_ids(frame.roles, len(frame.nodes))
        self.groups = [np.flatnonzero(groups == g) for g in range(len(self.role_names))]
        self.peers = [PeerOutlierDetector(len(idx), window=cfg.window, continuity=cfg.continuity,
                                          threshold=cfg.threshold, clip=cfg.clip) for idx in self.groups]
        self.history = SelfHistory(len(frame.nodes), span=cfg.history_span, warmup=cfg.history_warmup)
        self.rank_role_names, rank_groups = _group_ids(frame.rank_roles, len(frame.ranks))
        self.stragglers = StragglerDetector(rank_groups, shift=cfg.straggler_shift,
                                            threshold=cfg.straggler_threshold, window=cfg.straggler_window,
                                            min_sigma=cfg.straggler_min_sigma, history_span=cfg.history_span,
                                            history_warmup=cfg.history_warmup)


class HealthMonitor:
    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.decisions: dict[tuple[str, str], HealthDecision] = {}   # (node, key) -> active decision
        self._calm: dict[tuple[str, str], int] = {}
        self._jobs: dict[str, _Job] = {}
        self._groups: dict[str, PeerGroups] = {}   # job -> its inferred peer groups (jobs that declare no role)
        self._last_eval = -np.inf
        self._last_liveness = -np.inf   # liveness is judged every half interval (the detectors every interval)
        self._node_job: dict[str, str | None] = {}
        self._gpu_role: dict[str, dict[int | None, str]] = {}
        self._latest: dict[str, dict[tuple[int, int | None], tuple[float, float]]] = {}
        self._new_steps: dict[Rank, float] = {}
        self._ranks: dict[str, dict[Rank, tuple[str | None, int | None]]] = {}   # job -> rank -> (role, rank id)
        self._node_seen: dict[str, float] = {}
        self._heard_since: dict[str, float] = {}
        self._gpu_seen: dict[str, dict[int, float]] = {}
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
        elif now - self._last_liveness >= self.config.interval / 2:
            out += [d for d in self._judge_liveness(now, settle=False) if d is not None]
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

    @property
    def active(self) -> dict[str, HealthDecision]:
        """Each node with an active decision -> the one that governs it (a lasting fault before a transient one,
        then a hard fault before a soft one, then the newest)."""
        out: dict[str, HealthDecision] = {}
        for (node, _), d in self.decisions.items():
            best = out.get(node)
            if best is None or _weight(d) > _weight(best):
                out[node] = d
        return out

    def active_on(self, node: str) -> list[HealthDecision]:
        return [d for (n, _), d in self.decisions.items() if n == node]

    def release(self, node: str) -> None:
        """Return a node to service: forget its decisions; counters it showed become its new baseline, GPUs it
        lost are no longer expected, and its heartbeat is watched again from its next one."""
        for key in [k for k in self.decisions if k[0] == node]:
            del self.decisions[key]
            self._calm.pop(key, None)
        self.liveness.forget(node)
        self._gpu_seen.pop(node, None)
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
            if now - self._node_seen.get(node, -np.inf) > self.config.heartbeat_timeout:
                self._heard_since[node] = now   # heard again after a silence: its GPUs are judged from now
            self._node_seen[node] = now
        stale_after = self.config.stale_after
        out: list[HealthDecision] = []
        node_job, gpu_role, gpu_seen, latest = self._node_job, self._gpu_role, self._gpu_seen, self._latest
        fresh: dict[tuple[str, float], bool] = {}   # (node, ts) -> usable for comparing peers now
        measured: dict[str, set[int]] = {}          # node -> GPUs with measurements in this batch
        counts: list[Sample] = []
        for s in samples:
            node, name = s.node, s.metric
            if name == "gpu_source_up" and s.value == 0:
                # The agent cannot read its GPUs (the DCGM exporter is down): their silence is the agent's
                # outage, not lost GPUs. Series that come back are watched again; a GPU that does not is seen
                # through gpu_count.
                gpu_seen.pop(node, None)
                continue
            metric = BY_NAME.get(name)
            if metric is None:
                continue
            if node_job.get(node) != s.job:
                node_job[node] = s.job
                gpu_role.pop(node, None)
            kind = metric.kind
            if name not in EVENTS:
                if s.role is not None:
                    gpu_role.setdefault(node, {})[s.gpu] = s.role
                # A GPU is alive while its measurements arrive: a counter the exporter keeps serving from its
                # cache (the ECC count of a GPU that fell off the bus) says nothing of it.
                if s.gpu is not None and kind != "hard":
                    gpu_seen.setdefault(node, {})[s.gpu] = now
                    measured.setdefault(node, set()).add(s.gpu)
            if name == "gpu_count":
                counts.append(s)   # judged after the batch, which then says which GPU's measurements are missing
                continue
            if kind == "hard":
                decision = self._hard(s, now)
                if decision is not None:
                    out.append(decision)
                continue
            key = (node, s.ts)
            ok = fresh.get(key)
            if ok is None:
                ok = fresh[key] = self._clocks.age(node, now, s.ts) <= stale_after
            if not ok:
                continue   # replayed: evidence about the past, not for comparing peers now
            if kind == "compared":
                latest.setdefault(node, {})[(COMPARED_INDEX[name], s.gpu)] = (now, s.value)
            elif kind == "step":
                if s.job is not None:
                    self._new_steps[(node, s.gpu)] = s.value
                    self._ranks.setdefault(s.job, {})[(node, s.gpu)] = (s.role, s.rank)
        for s in counts:
            decision = self._judge_gpu_count(s, measured.get(s.node))
            if decision is not None:
                out.append(decision)
        return out

    def _hard(self, s: Sample, now: float) -> HealthDecision | None:
        node, value = s.node, s.value
        if s.metric == "heartbeat":
            if value == 0:  # the agent stopped on purpose: its silence from now on is no fault
                self.liveness.forget(node)
                self._gpu_seen.pop(node, None)
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
        return None

    def _judge_gpu_count(self, s: Sample, measured: set[int] | None) -> HealthDecision | None:
        """A drop in the node's GPU count is a lost GPU at once, whatever that GPU's other series still do.
        The lost GPUs are named where the batch shows them: GPUs known to the node whose measurements it lacks."""
        node, value = s.node, s.value
        self._gpu_count[node] = value
        expected = self._gpu_expected.setdefault(node, value)
        if value >= expected:
            self._gpu_expected[node] = value
            return None
        evidence: dict[str, Any] = {"metric": "gpu_count", "window": 1, "score": expected - value, "value": value,
                                    "expected": expected}
        if measured is not None:
            missing = sorted(set(self._gpu_seen.get(node, {})) - measured)
            if missing:
                evidence["gpus"] = missing
        return self._confirm(s.ts, node, "fault", "gpu-lost", evidence, checkpointable=False)

    def _confirm(self, ts: float, node: str, kind: Literal["fault", "straggler"], reason: str, evidence: dict[str, Any],
                 *, transient: bool = False, checkpointable: bool = True) -> HealthDecision | None:
        key = (node, decision_key(reason))
        current = self.decisions.get(key)
        # One decision per node and kind; within a kind only a lasting finding may replace a transient one.
        if current is not None and (transient or not current.transient):
            return None
        decision = HealthDecision(ts, node, kind, reason, evidence, self._node_job.get(node), transient, checkpointable)
        self.decisions[key] = decision
        self._calm[key] = 0
        return decision

    def _settle(self, ts: float, key: tuple[str, str], calm: bool | None) -> HealthDecision | None:
        """Count one evaluation of an active clearable decision; clear it when calm long enough. `calm` None: the
        machine was not judged this evaluation; it neither counts towards clearing nor restarts the count."""
        if calm is None:
            return None
        self._calm[key] = self._calm[key] + 1 if calm else 0
        if self._calm[key] < self.config.clear_after:
            return None
        decision = self.decisions.pop(key)
        del self._calm[key]
        return HealthDecision(ts, decision.node, decision.kind, decision.reason,
                              {**decision.evidence, "cleared_after": self.config.clear_after}, decision.job,
                              decision.transient, decision.checkpointable, "cleared")

    # -- evaluation ----------------------------------------------------------

    def _node_role(self, node: str) -> str | None:
        roles = self._gpu_role.get(node)
        return "+".join(sorted(set(roles.values()))) if roles else None

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
            known = self._ranks.get(job, {})
            ranks = tuple(sorted((r for r in known if self._node_job.get(r[0]) == job),
                                 key=lambda r: (r[0], -1 if r[1] is None else r[1])))
            steps = np.array([self._new_steps.get(r, np.nan) for r in ranks])
            frames.append(JobFrame(job, tuple(nodes), values, ranks, steps,
                                   tuple(self._node_role(n) for n in nodes),
                                   tuple(known[r][0] for r in ranks), tuple(known[r][1] for r in ranks)))
        self._new_steps.clear()
        return frames

    def _evaluate(self, now: float, frames: Sequence[JobFrame]) -> list[HealthDecision]:
        self._last_eval = now
        out: list[HealthDecision | None] = []
        for frame in frames:
            out += self._evaluate_job(now, frame)
        out += self._judge_liveness(now)
        out += self._judge_gpu_silence(now)
        return [d for d in out if d is not None]

    def _judge_liveness(self, now: float, settle: bool = True) -> list[HealthDecision | None]:
        """Lost heartbeats and pipeline faults; `settle`: also count an evaluation towards clearing lost
        heartbeats (once per interval)."""
        self._last_liveness = now
        timeout = self.config.heartbeat_timeout
        lost, findings = self.liveness.evaluate(now, self.domains)
        self._pipeline += findings
        out: list[HealthDecision | None] = []
        for key in [k for k in self.decisions if k[1] == "heartbeat-lost"] if settle else ():
            if self.liveness.watched(key[0]):
                out.append(self._settle(now, key, self.liveness.silence(key[0], now) <= timeout))
        for node in lost:
            silent = self.liveness.silence(node, now)
            out.append(self._confirm(now, node, "fault", "heartbeat-lost",
                                     {"metric": "heartbeat", "window": round(timeout / self.config.interval, 3),
                                      "score": round(silent, 3), "last_seen": round(now - silent, 3),
                                      "last_sample_ts": self._heartbeat_ts.get(node)},
                                     transient=True, checkpointable=False))
        return out

    def _judge_gpu_silence(self, now: float) -> list[HealthDecision | None]:
        """A GPU whose series stopped while its node's others go on is lost (a silent node is liveness's)."""
        out: list[HealthDecision | None] = []
        limit = self.config.gpu_silence
        for node, gpus in self._gpu_seen.items():
            heard = self._node_seen.get(node, -np.inf)
            if now - heard > self.config.interval * 1.5:
                continue
            since = self._heard_since.get(node, -np.inf)
            silent = sorted(g for g, seen in gpus.items() if heard - max(seen, since) >= limit)
            if silent:
                last = min(gpus[g] for g in silent)
                out.append(self._confirm(now, node, "fault", "gpu-lost", {
                    "metric": "gpu_series", "window": round(limit / self.config.interval, 3),
                    "score": round(heard - max(last, since), 3), "gpus": silent, "last_seen": round(last, 3)},
                    checkpointable=False))
        return out

    def _inferred_groups(self, frame: JobFrame, healthy: np.ndarray) -> JobFrame | None:
        """The frame with the job's inferred peer groups as its roles; None while they are being learned."""
        cfg = self.config
        groups = self._groups.get(frame.job)
        if groups is None or groups.nodes != frame.nodes:
            groups = self._groups[frame.job] = PeerGroups(frame.nodes, window=cfg.group_window,
                                                          learn_after=cfg.group_learn_after, every=cfg.group_every,
                                                          gap=cfg.group_gap)
        rows = {n: i for i, n in enumerate(frame.nodes)}
        if not groups.known:
            per_node: list[list[float]] = [[] for _ in frame.nodes]
            for (node, _), t in zip(frame.ranks, frame.step_times):
                if t > 0:
                    per_node[rows[node]].append(float(np.log(t)))
            steps = np.array([float(np.median(v)) if v else np.nan for v in per_node])
            groups.observe(frame.values, steps, healthy)
        if groups.labels is None:
            return None
        labels = groups.labels
        return replace(frame, roles=labels, rank_roles=tuple(labels[rows[r[0]]] for r in frame.ranks))

    def _evaluate_job(self, now: float, frame: JobFrame) -> list[HealthDecision]:
        flagged = {n for n, _ in self.decisions}
        healthy = np.array([n not in flagged for n in frame.nodes], dtype=bool)
        if len(frame.nodes) < 3 or any(frame.roles) or any(frame.rank_roles):
            return self._judge_job(now, frame, frame.job, healthy, None)
        # No role declared: what no role changes (links and lanes up, thermal throttling) is compared across
        # the whole job, from the start; the rest within the job's inferred groups once they are known.
        inferred = self._inferred_groups(frame, healthy)
        hardware = replace(frame, values=np.where(_ROLE_SHAPED, np.nan, frame.values), roles=(), ranks=(),
                           step_times=np.empty(0), rank_roles=(), rank_ids=())
        out = self._judge_job(now, hardware, f"{frame.job}\0hardware", healthy, ~_ROLE_SHAPED)
        if inferred is not None:
            work = replace(inferred, values=np.where(_ROLE_SHAPED, inferred.values, np.nan))
            out += self._judge_job(now, work, frame.job, healthy, _ROLE_SHAPED)
        return out

    def _judge_job(self, now: float, frame: JobFrame, state_key: str, healthy: np.ndarray,
                   owned: np.ndarray | None) -> list[HealthDecision]:
        """Run the detectors of one job (state under `key`) on `frame`; `owned`: the compared metrics whose
        findings this pass settles (None: all of them, and stragglers)."""
        cfg = self.config
        state = self._jobs.get(state_key)
        if state is None or state.key != (frame.nodes, frame.roles, frame.ranks, frame.rank_roles):
            state = self._jobs[state_key] = _Job(frame, cfg)
        out: list[HealthDecision | None] = []
        own = state.history.score(frame.values)
        # What the whole job does together (a load shift, a checkpoint) is nobody's fault. Its healthy machines
        # say what that is; where fewer than three are healthy (faults found on the others), all its machines
        # do: a median of three or more is not moved by one faulty machine.
        sayers = healthy if healthy.sum() >= 3 else np.ones(len(frame.nodes), dtype=bool)
        if sayers.sum() >= 3:
            common = own[sayers]
            shared = np.isfinite(common).sum(axis=0) >= 3
            shift = np.where(shared, np.nan_to_num(nanmedian0(common)), 0.0)
            # While the whole job is far from its usual level (a checkpoint, a slow data loader), own histories
            # neither judge nor learn: machines at different levels do not move by the same z.
            excursion = np.abs(shift) > cfg.threshold
            own = np.where(excursion, np.nan, own - shift)
        else:
            excursion = np.zeros(own.shape[1], dtype=bool)
        own = _less_role_change(own, state.groups, healthy)
        state.history.learn(frame.values, ~(own > cfg.threshold) & healthy[:, None] & ~excursion)
        for g, idx in enumerate(state.groups):
            detector, peers = state.peers[g], healthy[idx]
            values = frame.values[idx]
            if peers.sum() >= 3:
                findings, basis = detector.update(values, peers), "role-peers"
            else:
                findings, basis = detector.judge(own[idx], values, state.history.base[idx]), "own-history"
            for f in findings:
                node = frame.nodes[idx[f.member]]
                out.append(self._confirm(now, node, "fault", f"outlier:{f.metric}", {
                    "metric": f.metric, "window": cfg.window, "score": round(f.score, 3), "value": f.value,
                    "peer_median": f.peer_median, "continuity": f.streak, "peers": int(peers.sum()),
                    "role": state.role_names[g], "basis": basis,
                }, transient=BY_NAME[f.metric].transient))
        if frame.ranks:
            row_of = {n: i for i, n in enumerate(frame.nodes)}
            rank_healthy = healthy[[row_of[r[0]] for r in frame.ranks]]
            slow: dict[str, list] = {}
            for f in state.stragglers.update(frame.step_times, rank_healthy):
                slow.setdefault(frame.ranks[f.member][0], []).append(f)
            for node, findings in slow.items():
                worst = max(findings, key=lambda f: f.value)
                out.append(self._confirm(now, node, "straggler", "slow-rank", {
                    "metric": "step_time", "window": cfg.straggler_window, "score": round(worst.score, 3),
                    "slowdown": round(worst.value - 1.0, 4),
                    "sigma": round(float(state.stragglers.sigma[worst.member]), 4),
                    "basis": str(state.stragglers.basis[worst.member]),
                    "role": frame.rank_roles[worst.member] if frame.rank_roles else None,
                    "gpus": sorted(-1 if frame.ranks[f.member][1] is None else frame.ranks[f.member][1]
                                   for f in findings),
                    "ranks": sorted(frame.rank_ids[f.member] for f in findings
                                    if frame.rank_ids and frame.rank_ids[f.member] is not None),
                }, transient=True))
        rows = {n: i for i, n in enumerate(frame.nodes)}
        for key in [k for k in self.decisions if k[0] in rows and k[1] in ("outlier", "straggler")]:
            node = key[0]
            calm: bool | None
            if key[1] == "straggler":
                if owned is not None and not frame.ranks:
                    continue   # the pass that judges step times settles it
                calm = all(state.stragglers.calm(i) for i, r in enumerate(frame.ranks) if r[0] == node)
            else:
                metric = COMPARED_INDEX.get(self.decisions[key].evidence["metric"])
                if owned is not None and (metric is None or not owned[metric]):
                    continue
                row = rows[node]
                g = next(g for g, idx in enumerate(state.groups) if row in idx)
                member = int(np.flatnonzero(state.groups[g] == row)[0])
                calm = state.peers[g].calm(member, COMPARED_INDEX[self.decisions[key].evidence["metric"]])
            out.append(self._settle(now, key, calm))
        return [d for d in out if d is not None]


def _less_role_change(own: np.ndarray, groups: Sequence[np.ndarray], healthy: np.ndarray) -> np.ndarray:
    """Own-history scores less what a role group of two healthy machines does together.

    A change of one role only (a slow data loader feeding the first stage raises its CPU) does not move the
    job's median; in a group of two it shows on both machines. Their common part is the smaller of the two
    scores where both point the same way: a role-wide change leaves about nothing, a fault of one machine
    keeps all but its partner's noise."""
    out = own.copy()
    for idx in groups:
        pair = idx[healthy[idx]]
        if len(pair) != 2:
            continue
        a, b = own[pair[0]], own[pair[1]]
        common = np.where(np.sign(a) == np.sign(b), np.sign(a) * np.minimum(np.abs(a), np.abs(b)), 0.0)
        common = np.nan_to_num(common)
        out[pair] = own[pair] - common
    return out


def _weight(d: HealthDecision) -> tuple[bool, bool, float]:
    return (not d.transient, d.hard, d.ts)
