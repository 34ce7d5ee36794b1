"""The demo's live view: jobs, serving, nodes and the latest Events, redrawn in place (rich) on a terminal, a
short summary line every 30 s otherwise (a log, a test)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from flotilla.commands.demo import Demo

UNHEALTHY = "flotilla.dev/unhealthy"


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for c in columns:
        table.add_column(c)
    for row in rows:
        table.add_row(*row)
    return table


def snapshot(demo: "Demo") -> dict[str, list[list[str]]]:
    jobs = []
    for j in demo.get("trainingjobs").get("items", []):
        s, spec = j.get("status", {}), j["spec"]
        jobs.append([j["metadata"]["name"], s.get("phase", "Pending"), str(s.get("gpus", 0)),
                     f"{s.get('progress', {}).get('steps', 0)}/{spec.get('totalSteps')}",
                     ",".join(p["node"] for p in s.get("placement", [])), s.get("estimatedCompletion", ""),
                     {True: "yes", False: "no"}.get(s.get("deadlineMet"), "")])
    serving = []
    for d in demo.get("servingdeployments").get("items", []):
        s = d.get("status", {})
        serving.append([d["metadata"]["name"], s.get("phase", "Pending"),
                        f"{s.get('prefillReplicas', 0)}:{s.get('decodeReplicas', 0)}",
                        d["spec"].get("planner", {}).get("mode", "auto")])
    nodes = []
    for n in demo.get("nodes").get("items", []):
        taints = [t for t in n.get("spec", {}).get("taints") or [] if t.get("key") == UNHEALTHY]
        nodes.append([n["metadata"]["name"], n.get("status", {}).get("capacity", {}).get("nvidia.com/gpu", "0"),
                      "tainted " + taints[0]["effect"] if taints else "healthy"])
    items = sorted(demo.get("events", "-A").get("items", []),
                   key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")[-6:]
    events = [[(e.get("lastTimestamp") or "")[11:19], e["involvedObject"].get("name", ""), e.get("reason", ""),
               (e.get("message") or "")[:90]] for e in items]
    return {"jobs": jobs, "serving": serving, "nodes": nodes, "events": events}


def render(view: dict[str, list[list[str]]]) -> Group:
    return Group(
        _table("TrainingJobs", ["NAME", "PHASE", "GPUS", "STEPS", "NODES", "ETA", "ON TIME"], view["jobs"]),
        _table("ServingDeployments", ["NAME", "PHASE", "P:D", "MODE"], view["serving"]),
        _table("Nodes", ["NAME", "GPUS", "HEALTH"], view["nodes"]),
        _table("Latest events", ["TIME", "OBJECT", "REASON", "MESSAGE"], view["events"]))


def live(demo: "Demo", timeout: float | None) -> None:
    """Until Ctrl-C, or `timeout` seconds; raises RuntimeError when one of the demo's processes exits."""
    end = None if timeout is None else time.monotonic() + timeout
    interactive = sys.stdout.isatty()
    last_line = 0.0
    with Live(render(snapshot(demo)), refresh_per_second=1, transient=False,
              auto_refresh=False) if interactive else _NoLive() as screen:
        while end is None or time.monotonic() < end:
            if (name := demo.dead()) is not None:
                raise RuntimeError(f"{name} exited; see {demo.state / (name + '.log')}")
            view = snapshot(demo)
            if interactive:
                screen.update(render(view), refresh=True)
            elif time.monotonic() - last_line >= 30:
                phases = ", ".join(f"{j[0]} {j[1]} {j[2]} GPUs" for j in view["jobs"])
                print(f"[demo] jobs: {phases}", flush=True)
                last_line = time.monotonic()
            time.sleep(2)


class _NoLive:
    """Stands in for rich's Live where nothing redraws (not a terminal)."""

    def __enter__(self) -> "_NoLive":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: object, refresh: bool = False) -> None:
        return None
