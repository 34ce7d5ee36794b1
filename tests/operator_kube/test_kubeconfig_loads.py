"""Loads of one kubeconfig in several threads at once (the operator makes its clients in threads while kopf
logs in): each gets its certificate files whole. The client remembers a certificate's temporary file before
it has written it; a load at that moment got an empty file and kopf's observer failed at start-up with
"no certificate or crl found"."""

from __future__ import annotations

import base64
import builtins
import threading
import time
from pathlib import Path

import yaml
from kubernetes.config import kube_config

from flotilla import kubeapi

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_concurrent_loads_get_whole_certificate_files(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1",
                                               "certificate-authority-data": base64.b64encode(PEM).decode()}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "_temp_files", {})

    def slow_open(name, mode="r", *args, **kwargs):  # the file is registered; its content comes a moment later
        if "w" in mode:
            time.sleep(0.05)
        return builtins.open(name, mode, *args, **kwargs)

    monkeypatch.setattr(kube_config, "open", slow_open, raising=False)
    found: list[bytes] = []

    def load() -> None:
        found.append(Path(kubeapi.load_configuration().ssl_ca_cert).read_bytes())

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == [PEM] * 4
