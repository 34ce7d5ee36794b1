"""What a chaos case counts, and the figures `bench/chaos.py` prints over all of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable

# The harm a fault may do. Every one must stay 0.
COUNTERS = ("jobs_lost", "duplicate_pods", "gpus_promised_twice", "steps_lost_past_checkpoint", "false_taints",
            "forged_writes_accepted", "http_5xx")


@dataclass
class Outcome:
    case: str
    passed: bool = False          # the case's own checks held (the job finished, the fault was reported, ...)
    jobs_lost: int = 0            # jobs that ended Failed, or never finished, or were marked done without running
    duplicate_pods: int = 0       # worker pods of one job alive at once beyond its worker set (two generations, two copies)
    gpus_promised_twice: int = 0  # GPUs placed (status.placement) or bound to two holders at the same time
    steps_lost_past_checkpoint: int = 0  # steps a job went back past its last acknowledged checkpoint
    false_taints: int = 0         # nodes tainted or marked unhealthy while their hardware was healthy
    forged_writes_accepted: int = 0  # samples/stats from a caller not entitled to them that were accepted
    http_5xx: int = 0             # 5xx answers from the controller's API
    details: str = ""             # what happened, for the report and for a failing test's message
    seconds: float = 0.0

    def harmless(self) -> bool:
        return all(getattr(self, c) == 0 for c in COUNTERS)

    def ok(self) -> bool:
        return self.passed and self.harmless()

    def row(self) -> dict:
        return asdict(self)


def summary(outcomes: Iterable[Outcome]) -> dict:
    """The contract line: {"cases": n, "cases_passed": n, <each counter summed>}."""
    outcomes = list(outcomes)
    out = {"cases": len(outcomes), "cases_passed": sum(o.ok() for o in outcomes)}
    for c in COUNTERS:
        out[c] = sum(getattr(o, c) for o in outcomes)
    return out


assert set(COUNTERS) <= {f.name for f in fields(Outcome)}
