"""Host metrics from /proc: CPU utilisation, memory available, network throughput and errors.

Network counters are summed over the node's physical NICs: the interfaces that
/sys/class/net shows with a `device` (Ethernet, InfiniBand). On the node's
network (the chart's hostNetwork) that leaves out the veths, bridges and
tunnels of the pods, whose traffic is also counted on the NIC and whose drops
(a pod going away) are no fault of the node. Where no interface has a device
(a container's own network namespace, a test's fake /proc) every interface but
lo counts.
"""

from __future__ import annotations

from pathlib import Path

from flotilla.agent.rates import CounterRates
from flotilla.health.samples import Sample


class HostSource:
    name = "host"

    def __init__(self, node: str, proc: str | Path = "/proc", sys: str | Path = "/sys") -> None:
        self.node = node
        self.proc = Path(proc)
        self.sys = Path(sys)
        self._cpu_prev: tuple[int, int] | None = None
        self._rates = CounterRates()

    def _cpu(self) -> tuple[int, int]:
        fields = [int(x) for x in (self.proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        return sum(fields), idle

    def _physical(self, names: list[str]) -> set[str]:
        physical = {n for n in names if (self.sys / "class" / "net" / n / "device").exists()}
        return physical or {n for n in names if n != "lo"}

    def _net(self) -> tuple[int, int, int]:
        rx = tx = errors = 0
        rows = {}
        for line in (self.proc / "net" / "dev").read_text().splitlines()[2:]:
            name, _, data = line.partition(":")
            rows[name.strip()] = data
        counted = self._physical(list(rows))
        for name, data in rows.items():
            if name not in counted:
                continue
            f = [int(x) for x in data.split()]
            rx, tx = rx + f[0], tx + f[8]
            errors += f[2] + f[3] + f[10] + f[11]   # rx errs, rx drop, tx errs, tx drop
        return rx, tx, errors

    def _mem_available_mib(self) -> float:
        for line in (self.proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
        raise ValueError(f"{self.proc / 'meminfo'} has no MemAvailable line")

    def collect(self, now: float) -> list[Sample]:
        cpu, net = self._cpu(), self._net()
        out = [Sample(now, self.node, "mem_available", self._mem_available_mib())]
        if self._cpu_prev is not None and cpu[0] > self._cpu_prev[0]:
            total0, idle0 = self._cpu_prev
            busy = (cpu[0] - total0) - (cpu[1] - idle0)
            out.append(Sample(now, self.node, "cpu_util", 100.0 * busy / (cpu[0] - total0)))
        self._cpu_prev = cpu
        for metric, value, scale in (("net_rx", net[0], 1e-6), ("net_tx", net[1], 1e-6), ("net_errors", net[2], 1.0)):
            rate = self._rates.rate(metric, now, value)
            if rate is not None:
                out.append(Sample(now, self.node, metric, rate * scale))
        return out

    def close(self) -> None:
        pass
