"""Failpoints: kill the operator at an exact point of its write path. A test-only hook.

The chaos suite (e2e/chaos/operator_cases.py) sets `FLOTILLA_FAILPOINTS` to make the operator
SIGKILL itself just before or just after a named write is sent, e.g. between recording a new
placement and creating its pods, to check that a restarted operator converges from there.
Unset (always, outside tests) every hook is a dictionary lookup that finds nothing.

    FLOTILLA_FAILPOINTS=WHEN:ACTION[:TEXT],...

WHEN is `before` or `after` (after: the API server answered with success), ACTION an action's
type name (`PatchStatus`, `PatchAnnotations`, `CreatePod`, `DeletePod`, `ApplyDeployment`,
`ApplyObject`, `PostEvent`), TEXT an optional string the action's compact JSON must contain, e.g.
`after:CreatePod:"flotilla.dev/generation":"1"` (a pod of worker generation 1) or
`after:PatchStatus:"reshards":1`. The first matching write kills the process (SIGKILL: no
cleanup, no lease release, as a node failure or the OOM killer would).

`FLOTILLA_FAILPOINT_SIGNAL=STOP` sends SIGSTOP instead: the process freezes right there, in the
middle of its write chain, as a long GC pause or a frozen VM would, and goes on from there when
it gets SIGCONT. Each failpoint fires once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Mapping

log = logging.getLogger(__name__)
ENV = "FLOTILLA_FAILPOINTS"
SIGNAL_ENV = "FLOTILLA_FAILPOINT_SIGNAL"
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}
WHEN = ("before", "after")


@dataclass(frozen=True)
class Failpoint:
    when: str
    action: str
    text: str = ""

    def matches(self, when: str, action: Any) -> bool:
        if when != self.when or type(action).__name__ != self.action:
            return False
        return not self.text or self.text in _compact(action)


def parse(spec: str) -> tuple[Failpoint, ...]:
    """`WHEN:ACTION[:TEXT],...` -> failpoints; raises ValueError on a malformed entry."""
    out = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        when, _, rest = entry.partition(":")
        action, _, text = rest.partition(":")
        if when not in WHEN or not action:
            raise ValueError(f"{ENV}: {entry!r} is not WHEN:ACTION[:TEXT] with WHEN in {WHEN}")
        out.append(Failpoint(when, action, text))
    return tuple(out)


def _compact(action: Any) -> str:
    value = asdict(action) if is_dataclass(action) and not isinstance(action, type) else action
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def armed(environ: Mapping[str, str] = os.environ) -> tuple[Failpoint, ...]:
    return parse(environ.get(ENV, ""))


def signal_of(environ: Mapping[str, str] = os.environ) -> signal.Signals:
    name = environ.get(SIGNAL_ENV, "KILL")
    if name not in SIGNALS:
        raise ValueError(f"{SIGNAL_ENV}: {name!r} is not one of {sorted(SIGNALS)}")
    return SIGNALS[name]


_ARMED = armed()
_SIGNAL = signal_of()
_fired: set[Failpoint] = set()


def matching(when: str, action: Any, points: tuple[Failpoint, ...]) -> Failpoint | None:
    return next((fp for fp in points if fp.matches(when, action)), None)


def hit(when: str, action: Any) -> None:
    """A point of the write path: signal this process (SIGKILL, or SIGSTOP) if an armed failpoint matches."""
    if not _ARMED:
        return
    fp = matching(when, action, tuple(p for p in _ARMED if p not in _fired))
    if fp is not None:
        _fired.add(fp)
        log.warning("failpoint %s:%s%s hit: %s", fp.when, fp.action, f":{fp.text}" if fp.text else "",
                    _SIGNAL.name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), _SIGNAL)
