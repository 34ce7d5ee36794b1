"""Plays the kubelet for the worker pods of real PyTorch jobs on KWOK nodes, where no container runs.

For each worker pod of a namespace that the scheduler bound and KWOK marked Running, it starts the pod's
first container's command as a process on this machine, with the environment the pod spec gives it (the
operator's FLOTILLA_* variables, the checkpoint directory its hostPath volume mounts at the same path), in this
checkout (`python` is this interpreter). What this machine cannot give a pod is played as well: rank 0's DNS
name (FLOTILLA_RENDEZVOUS_ADDR, MASTER_ADDR) resolves to 127.0.0.1, and since the pods share this machine's
network namespace, each worker set gets a port of its own instead of the pod spec's. A pod deleted (the
operator retiring a worker set) has its process terminated; a process that exits has its pod marked exited
with its code (KWOK's flotilla-pod-exit stage), so the operator sees the job succeed or a worker fail.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from flotilla.resources import names
from flotilla.testing.services import free_port
from flotilla.testing.torchjob import ROOT, process_env

log = logging.getLogger(__name__)


class TorchKubelet:
    def __init__(self, namespace: str, log_dir: Path, interval: float = 0.5):
        from kubernetes import client, config

        config.load_kube_config()
        self.core = client.CoreV1Api()
        self.namespace, self.log_dir, self.interval = namespace, log_dir, interval
        self.procs: dict[str, tuple[subprocess.Popen, Any]] = {}  # pod name -> (process, its log)
        self.exit_codes: dict[str, int] = {}  # pod name -> what its process exited with
        self.ports: dict[tuple[str, str], int] = {}  # (job UID, generation) -> the worker set's rendezvous port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "TorchKubelet":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for name in list(self.procs):
            self._terminate(name)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception:  # an API hiccup: the next pass tries again
                log.exception("torch kubelet: pass failed")

    def sync(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"{names.LABEL_ROLE}={names.ROLE_WORKER}").items
        live = {p.metadata.name: p for p in pods if not p.metadata.deletion_timestamp}
        for name in [n for n in self.procs if n not in live]:
            self._terminate(name)  # deleted: the kubelet stops its containers
        for name, pod in live.items():
            if name not in self.procs and name not in self.exit_codes and pod.status.phase == "Running":
                self._run(pod)
        for name, (proc, _) in list(self.procs.items()):
            if proc.poll() is not None:
                self._exited(name, proc.returncode)

    def _run(self, pod: Any) -> None:
        container = pod.spec.containers[0]
        env = {e.name: e.value for e in container.env or [] if e.value is not None}
        key = (pod.metadata.labels[names.LABEL_JOB_UID], pod.metadata.labels[names.LABEL_GENERATION])
        port = self.ports.setdefault(key, free_port())
        env.update(FLOTILLA_RENDEZVOUS_ADDR="127.0.0.1", MASTER_ADDR="127.0.0.1",
                   FLOTILLA_RENDEZVOUS_PORT=str(port), MASTER_PORT=str(port))
        argv = [*(container.command or []), *(container.args or [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        out = open(self.log_dir / f"{pod.metadata.name}.log", "ab")
        proc = subprocess.Popen(argv, cwd=ROOT, env=process_env(env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[pod.metadata.name] = (proc, out)
        log.info("started %s: rank %s of %s", pod.metadata.name, env.get("FLOTILLA_RANK"),
                 env.get("FLOTILLA_WORLD_SIZE"))

    def _terminate(self, name: str) -> None:
        proc, out = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out.close()
        self.exit_codes[name] = proc.returncode

    def _exited(self, name: str, code: int) -> None:
        _, out = self.procs.pop(name)
        out.close()
        code = code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
        self.exit_codes[name] = code
        self.core.patch_namespaced_pod(name, self.namespace, {"metadata": {"annotations": {
            "flotilla.dev/sim-exit-code": str(code), "flotilla.dev/sim-exit-after": "0s"}}})
        log.info("%s exited with %d", name, code)
