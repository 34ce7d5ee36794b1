"""What the detectors conclude: one decision per node and event, with its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class HealthDecision:
    """A node confirmed faulty (or a straggler), or such a finding cleared by rule.

    `evidence` always holds `metric`, `window` (samples) and `score`, plus what
    the detector that decided adds (value, peer median, continuity, ranks, ...).
    `transient` findings clear by rule (state "cleared"); the others stay until
    an admin returns the node to service (`HealthMonitor.release`).
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

    def to_record(self) -> dict[str, Any]:
        """The `flotilla detect` output line: {"ts", "node", "kind", "reason", "evidence"}."""
        return {"ts": self.ts, "node": self.node, "kind": self.kind, "reason": self.reason, "evidence": self.evidence}
