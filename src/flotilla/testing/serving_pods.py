"""A kubelet and kube-proxy for serving pods on fake (KWOK) nodes, which run no containers: for the e2e
tests and `flotilla demo`.

For each Running serving pod of a namespace (a pod of a ServingDeployment's Deployments, on a KWOK node; of
one ServingDeployment with `serving`), `ServingKubelet` starts an engine double (flotilla.testing.engine.server,
which stands in for vLLM) listening at the pod's IP and the engines' port, with the pod's role and GPU count,
and stops it when the pod goes. Pod IPs are in 127.0.0.0/8 (e2e/cluster.sh gives KWOK a loopback pod CIDR),
and every 127.x.y.z address is loopback on Linux, so a local process can bind each pod's own address.

Service ClusterIPs do not route here (no kube-proxy), so it also plays kube-proxy: for each Service of
the namespace's ServingDeployments, a TCP listener on 127.0.0.1 that forwards each connection to one of
the Service's ready endpoints (the Ready pods its selector matches: loopback addresses are refused in
EndpointSlices), round robin, once that engine answers /health (a readiness probe's part). `url(service)` is
where a client of that Service connects; decode engines reach the prefill Service through it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
from kubernetes import client, config

from flotilla.resources import names
from flotilla.testing.services import stop_process

log = logging.getLogger(__name__)
SRC = Path(__file__).resolve().parents[2]  # the engines run this checkout's flotilla


@dataclass
class Engine:
    pod: str
    role: str
    address: str  # ip:port
    proc: subprocess.Popen
    healthy: bool = False


@dataclass
class Proxy:
    service: str
    port: int
    backends: list[str] = field(default_factory=list)  # ready endpoints, ip:port
    connections: int = 0


class ServingKubelet:
    def __init__(self, namespace: str, log_dir: Path, poll_s: float = 0.5, *, kubeconfig: str | None = None,
                 serving: str | None = None, on_change: Callable[[], None] | None = None) -> None:
        """`serving`: only that ServingDeployment's pods; `on_change`: called after an engine starts or stops
        (the demo records their process ids)."""
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.namespace, self.log_dir, self.poll_s = namespace, log_dir, poll_s
        self.selector = f"{names.LABEL_SERVING}={serving}" if serving else names.LABEL_SERVING
        self.on_change = on_change
        self.engines: dict[str, Engine] = {}  # pod UID -> its engine
        self.proxies: dict[str, Proxy] = {}
        self._rr = itertools.count()
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._threads = [threading.Thread(target=self._loop.run_forever, daemon=True),
                         threading.Thread(target=self._run, daemon=True)]
        self.errors: list[str] = []

    # --- kube-proxy -------------------------------------------------------------------------
    def url(self, service: str) -> str:
        proxy = self.proxies.get(service) or self._listen(service)
        return f"http://127.0.0.1:{proxy.port}"

    def _listen(self, service: str) -> Proxy:
        async def start() -> Proxy:
            proxy = Proxy(service, 0)
            server = await asyncio.start_server(lambda r, w: self._forward(proxy, r, w), "127.0.0.1", 0)
            proxy.port = server.sockets[0].getsockname()[1]
            return proxy

        proxy = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.proxies[service] = proxy
        return proxy

    async def _forward(self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(50):  # a Service just made, or an engine starting: wait a little, as a client's retry would
            ready = [b for b in proxy.backends if any(e.address == b and e.healthy for e in self.engines.values())]
            if ready:
                break
            await asyncio.sleep(0.1)
        else:
            writer.close()
            return
        host, port = ready[next(self._rr) % len(ready)].rsplit(":", 1)
        proxy.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.close()
                except RuntimeError:
                    pass

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    # --- kubelet ----------------------------------------------------------------------------
    def start(self) -> "ServingKubelet":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._threads[1].join(10)
        for engine in self.engines.values():
            stop_process(engine.proc)
        self.engines.clear()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self) -> None:
        with httpx.Client(timeout=1.0) as http:
            while not self._stop.wait(self.poll_s):
                try:
                    self._sync(http)
                except Exception as e:  # the API server busy: try again next poll
                    self.errors.append(str(e))
                    log.warning("serving kubelet: %s", e)

    def _sync(self, http: httpx.Client) -> None:
        pods: list[Any] = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
        live: dict[str, Any] = {}
        for pod in pods:
            ip = pod.status.pod_ip
            if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running" and ip:
                live[pod.metadata.uid] = pod
        gone, new = set(self.engines) - set(live), set(live) - set(self.engines)
        for uid in gone:
            stop_process(self.engines.pop(uid).proc)
        for uid in new:
            self.engines[uid] = self._start_engine(live[uid])
        if (gone or new) and self.on_change is not None:
            self.on_change()
        for engine in self.engines.values():
            if not engine.healthy:
                try:
                    engine.healthy = http.get(f"http://{engine.address}/health").status_code == 200
                except httpx.HTTPError:
                    pass
        for service in list(self.proxies):
            self.proxies[service].backends = self._endpoints(service)

    def _start_engine(self, pod: Any) -> Engine:
        ip = pod.status.pod_ip
        if not ipaddress.ip_address(ip).is_loopback:
            raise RuntimeError(f"pod {pod.metadata.name} has IP {ip}, not loopback: start the cluster with "
                               "e2e/cluster.sh (its KWOK gives pods 127.x addresses)")
        labels = pod.metadata.labels
        role, serving = labels[names.LABEL_ROLE], labels[names.LABEL_SERVING]
        container = pod.spec.containers[0]
        port = next((p.container_port for p in container.ports or [] if p.name == "http"), names.ENGINE_PORT)
        tp = int((container.resources.limits or {}).get(names.GPU_RESOURCE, 1))
        args = [sys.executable, "-m", "flotilla.testing.engine.server", "--role", role, "--tp", str(tp),
                "--host", ip, "--port", str(port)]
        if role == names.ROLE_DECODE:
            args += ["--prefill-url", self.url(names.service_name(serving, names.ROLE_PREFILL))]
        out = open(self.log_dir / f"engine-{pod.metadata.name}.log", "a")
        path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
        # Its own process group, as everything `flotilla demo` starts, so that `demo --stop` can stop it.
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path},
                                start_new_session=True)
        out.close()
        return Engine(pod.metadata.name, role, f"{ip}:{port}", proc)

    def _endpoints(self, service: str) -> list[str]:
        """The Service's ready endpoints, from the pods its selector matches (as the EndpointSlice controller
        finds them: loopback pod IPs are refused in EndpointSlices themselves)."""
        try:
            svc: Any = self.core.read_namespaced_service(service, self.namespace)
        except client.ApiException as e:
            if e.status == 404:
                return []
            raise
        selector = ",".join(f"{k}={v}" for k, v in sorted((svc.spec.selector or {}).items()))
        port = svc.spec.ports[0].target_port
        pods: list[Any] = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(f"{p.status.pod_ip}:{port}" for p in pods
                      if p.status.pod_ip and p.metadata.deletion_timestamp is None
                      and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))

    def ready(self, role: str) -> list[Engine]:
        return [e for e in self.engines.values() if e.role == role and e.healthy]


def wait_healthy(kubelet: ServingKubelet, counts: dict[str, int], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(kubelet.ready(role)) >= n for role, n in counts.items()):
            return
        time.sleep(0.5)
    raise AssertionError(f"engines not healthy after {timeout}s: want {counts}, have "
                         f"{ {r: len(kubelet.ready(r)) for r in counts} }; kubelet errors: {kubelet.errors[-3:]}")
