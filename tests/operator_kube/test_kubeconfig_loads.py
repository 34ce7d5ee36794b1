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


def a_kubeconfig(tmp_path, monkeypatch) -> None:
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


def test_concurrent_loads_get_whole_certificate_files(tmp_path, monkeypatch):
    a_kubeconfig(tmp_path, monkeypatch)

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


def test_credentials_are_refreshed_at_most_once_a_second_not_before_every_request(tmp_path, monkeypatch):
    """The client's refresh hook sets every connection setting again before each request (the host's setter
    scans the environment for proxies): most of a request's CPU. It runs at most once a second."""
    a_kubeconfig(tmp_path, monkeypatch)
    configuration = kubeapi.load_configuration()
    scans = 0
    real = kube_config.KubeConfigLoader._set_config

    def counted(self, client_configuration):
        nonlocal scans
        scans += 1
        return real(self, client_configuration)

    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config", counted)
    for _ in range(100):
        assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer t"
    assert scans == 1
    time.sleep(kubeapi.CREDENTIALS_REFRESH_SECONDS)
    configuration.auth_settings()
    assert scans == 2
