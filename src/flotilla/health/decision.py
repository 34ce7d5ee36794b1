"""What the detectors conclude: one decision per node and fault kind, with its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class HealthDecision:
    """A node confirmed faulty (or a straggler), or such a finding cleared by rule.

    `evidence` always holds `metric`, `window` (samples) and `score`, plus what
    the detector that decided adds (value, peer median, continuity, ranks, ...).
    A node holds at most one active decision per `key` (the fault kind: "xid",
    "ecc", "gpu-lost", "heartbeat-lost", "outlier", "straggler"), so a finding
    of one kind never masks another. Soft findings (`outlier`, `straggler`) and
    lost heartbeats clear by rule (state "cleared") once the node looks normal
    again; hard faults stay until an admin returns the node to service
    (`HealthMonitor.release`). `transient` marks a fault that is intermittent by
    nature (the controller then only stops new work: NoSchedule).
    `checkpointable` is False when the job's processes on the node can no longer
    write a checkpoint, so the job must restart from its last one.
    """

    ts: float
    node: str
    kind: Literal["fault", "straggler"]
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    job: str | None = None
    transient: bool = False
    checkpointable: bool = True
    state: Literal["confirmed", "cleared"] = "confirmed"

    @property
    def key(self) -> str:
        return decision_key(self.reason)

    @property
    def hard(self) -> bool:
        return self.key in HARD_KEYS

    def to_record(self) -> dict[str, Any]:
        """The `flotilla detect` output line: {"ts", "node", "kind", "reason", "evidence"}."""
        return {"ts": self.ts, "node": self.node, "kind": self.kind, "reason": self.reason, "evidence": self.evidence}


HARD_KEYS = frozenset({"xid", "ecc", "gpu-lost", "heartbeat-lost"})


def decision_key(reason: str) -> str:
    """The fault kind of a decision reason: "xid-79" -> "xid", "outlier:gpu_util" -> "outlier", ..."""
    if reason.startswith("xid-"):
        return "xid"
    if reason.startswith("ecc-"):
        return "ecc"
    if reason.startswith("outlier:"):
        return "outlier"
    if reason == "slow-rank":
        return "straggler"
    return reason
