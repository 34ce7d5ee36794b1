"""A TrainingJob kept in a JSON file: the part of the Kubernetes API a worker uses, without Kubernetes.

For running a worker where there is no cluster (a laptop, a test, a benchmark): every rank is given the
same file, `JobClient(identity, api=FileJobAPI(path))` reads and patches it as it would the TrainingJob,
and whoever plays the operator writes the checkpoint request into it with `request_checkpoint` (the
annotation the operator writes). Writes are serialised with an exclusive lock on the file.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flotilla.reshard import encoding as checkpoint


class FileJobAPI:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | Path, name: str, namespace: str = "default", uid: str = "") -> "FileJobAPI":
        api = cls(path)
        api._write({"metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": {}}, "status": {}})
        return api

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, body: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)

    def read(self) -> dict[str, Any]:
        body = json.loads(self.path.read_text())
        if not isinstance(body, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return body

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> dict[str, Any]:
        return self.read()

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                       body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        with self._locked():
            job = self.read()
            if meta.get("uid") and meta["uid"] != job["metadata"].get("uid"):
                raise ValueError(f"uid {meta['uid']} does not match the job's ({job['metadata'].get('uid')})")
            job["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
            self._write(job)
            return job

    def request_checkpoint(self, generation: int, reason: str = "resize") -> None:
        """What the operator does to resize the job: annotate it with a checkpoint request."""
        self.patch_namespaced_custom_object("", "", "", "", "", {"metadata": {
            "annotations": checkpoint.request_annotation(generation, reason, time.time())}})

    def acknowledged(self) -> dict[str, Any] | None:
        return checkpoint.parse_ack(self.read()["metadata"].get("annotations"))

    def progress(self) -> dict[str, Any] | None:
        return checkpoint.parse_progress(self.read()["metadata"].get("annotations"))
