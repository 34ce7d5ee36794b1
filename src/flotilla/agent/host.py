"""Host metrics from /proc: CPU utilisation, memory available, network throughput and errors (all NICs but lo)."""

from __future__ import annotations

from pathlib import Path

from flotilla.health.samples import Sample


class HostSource:
    name = "host"

    def __init__(self, node: str, proc: str | Path = "/proc") -> None:
        self.node = node
        self.proc = Path(proc)
        self._prev: tuple[float, tuple[int, int], tuple[int, int, int]] | None = None

    def _cpu(self) -> tuple[int, int]:
        fields = [int(x) for x in (self.proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        return sum(fields), idle

    def _net(self) -> tuple[int, int, int]:
        rx = tx = errors = 0
        for line in (self.proc / "net" / "dev").read_text().splitlines()[2:]:
            name, _, data = line.partition(":")
            if name.strip() == "lo":
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
        if self._prev is not None and now > self._prev[0]:
            t0, (total0, idle0), (rx0, tx0, err0) = self._prev
            dt, busy = now - t0, (cpu[0] - total0) - (cpu[1] - idle0)
            if cpu[0] > total0:
                out.append(Sample(now, self.node, "cpu_util", 100.0 * busy / (cpu[0] - total0)))
            out += [Sample(now, self.node, "net_rx", (net[0] - rx0) / 1e6 / dt),
                    Sample(now, self.node, "net_tx", (net[1] - tx0) / 1e6 / dt),
                    Sample(now, self.node, "net_errors", (net[2] - err0) / dt)]
        self._prev = (now, cpu, net)
        return out

    def close(self) -> None:
        pass
