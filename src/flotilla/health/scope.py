"""What a fault takes out of service: one GPU (device-local) or the whole node.

A fault local to one GPU (it fell off the bus, a double-bit ECC error, a contained row-remap failure) should cost
that GPU, not the node's eight: the device plugin drops an unhealthy GPU from the node's allocatable count, and
NVIDIA's DRA driver taints the device on its ResourceSlice. `fault_scope(decision, gpus_on_node)` is the one
place that decides which:

* **device** — a hard fault that names its GPUs and is one of `DEVICE_LOCAL_XIDS`, an uncorrectable ECC error,
  or a lost GPU: those GPUs leave service, the node's others keep their work;
* **node** — everything else: a lost heartbeat (the node is gone), XIDs that say nothing about one GPU or that
  point at what GPUs share (NVLink, the GPU's system processor reset as a whole, `NODE_WIDE_XIDS`), network and
  host findings, peer outliers (a machine's row is its GPUs together), and a device-local fault whose GPU is not
  known;
* a device-local fault that would leave the node with more than `max_device_fraction` of its GPUs out (counting
  the ones already out) is escalated to the node: several GPUs failing at once point at what they share
  (the baseboard, a PCIe switch, power), and a node that is mostly out serves nobody.

Soft findings (stragglers, outliers) keep acting on the node as before: they stop new work (NoSchedule) and
clear by rule, and a straggler's slow GPUs are named in its evidence for the operator's placement to avoid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from flotilla.health.decision import HealthDecision

# XIDs that concern one GPU: it fell off the bus (79), a double-bit ECC error (48), row remapping failed (63, 64),
# contained / uncontained ECC errors (94, 95), GSP errors of that GPU (119, 120), a high SBE rate (92).
DEVICE_LOCAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 79, 92, 94, 95, 119, 120})
# XIDs that point at what GPUs share or at the driver: NVLink errors (74), internal micro-controller halts that
# take the driver down (61, 62), and the ones without a device-level meaning in NVIDIA's table (123, 140).
NODE_WIDE_XIDS: frozenset[int] = frozenset({61, 62, 74, 123, 140})

Scope = Literal["device", "node"]


@dataclass(frozen=True, slots=True)
class FaultScope:
    scope: Scope
    gpus: tuple[int, ...]   # the GPUs out of service (all of the node's for scope "node", where known)
    why: str

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


def fault_scope(decision: HealthDecision, gpus_on_node: int, already_out: Iterable[int] = (), *,
                max_device_fraction: float = 0.5) -> FaultScope:
    """The part of `decision.node` that `decision` takes out of service. `gpus_on_node`: the node's GPUs
    (its `nvidia.com/gpu` capacity); `already_out`: GPUs of it already out of service for device faults."""
    if gpus_on_node < 1:
        raise ValueError("gpus_on_node must be at least 1")
    if not 0 < max_device_fraction <= 1:
        raise ValueError("max_device_fraction must be in (0, 1]")
    whole = tuple(range(gpus_on_node))
    gpus = _named_gpus(decision)
    key = decision.key
    if key == "xid":
        code = int(decision.reason.split("-", 1)[1])
        if code not in DEVICE_LOCAL_XIDS:
            return FaultScope("node", whole, f"XID {code} is not local to one GPU")
    elif key not in ("ecc", "gpu-lost"):
        return FaultScope("node", whole, f"a {key} finding concerns the machine")
    if not gpus:
        return FaultScope("node", whole, f"{decision.reason}: the GPU is not known")
    outside = [g for g in gpus if g >= gpus_on_node]
    if outside:
        raise ValueError(f"decision names GPU {outside[0]} but node {decision.node} has {gpus_on_node}")
    out = sorted(set(already_out) | set(gpus))
    if len(out) > max_device_fraction * gpus_on_node:
        return FaultScope("node", whole, f"{len(out)} of {gpus_on_node} GPUs out (more than "
                                         f"{max_device_fraction:g}): what they share is suspect")
    return FaultScope("device", tuple(gpus), f"{decision.reason} on GPU {', '.join(map(str, gpus))} only")


def _named_gpus(decision: HealthDecision) -> tuple[int, ...]:
    ev = decision.evidence
    if isinstance(ev.get("gpus"), (list, tuple)):
        return tuple(sorted({int(g) for g in ev["gpus"] if isinstance(g, int) and g >= 0}))
    gpu = ev.get("gpu")
    return (gpu,) if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 else ()
