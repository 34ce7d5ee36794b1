"""The operator's /metrics on a real API server (docs/operator-metrics.md).

A module of its own: the module-scoped operator of e2e/test_operator.py watches every namespace, and a second
operator on the same jobs would race this one to admit them."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.kube import OperatorProcess, apply, get, wait_for
from e2e.test_operator import job_manifest, phase


def test_the_operator_serves_its_metrics_admissions_rejections_and_passes(log_dir: Path, namespace):
    """The operator's /metrics on a real API server: an admitted job counts as an admission, a job that cannot
    meet its deadline as a rejection with its reason, and passes have a duration (docs/operator-metrics.md)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from flotilla.testing.services import free_port

    port = free_port()
    op = OperatorProcess(log_dir / "operator-metrics.log", "--namespace", namespace,
                         "--metrics-port", str(port)).start()

    def scrape() -> dict:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.TransportError:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    try:
        wait_for("the operator's metrics", lambda: bool(scrape()), timeout=60)
        hopeless = json.loads(job_manifest("hopeless", min_gpus=1, max_gpus=4))
        hopeless["spec"].update(deadlineSeconds=60, totalSteps=10_000_000)  # 3.5 steps/s at most
        for manifest in (job_manifest("fits", min_gpus=1, max_gpus=2), json.dumps(hopeless)):
            assert apply(manifest, namespace).returncode == 0
        phases = lambda: (phase("fits", namespace), phase("hopeless", namespace))  # noqa: E731
        wait_for("fits Admitted and hopeless Rejected", lambda: phases() if phases()[0] in ("Admitted", "Running")
                 and phases()[1] == "Rejected" else print(phases()), timeout=60)
        admitted = ("flotilla_operator_admissions_total", (("guarantee", "deadline"),))
        rejected = ("flotilla_operator_rejections_total", (("reason", "capacity"),))
        # The counters move when the status patches are answered: by the time the phases show, or just after.
        wait_for("the admission and the rejection counted",
                 lambda: (m := scrape()).get(admitted) == 1 and m.get(rejected) == 1
                 or print({k: v for k, v in m.items() if "admissions" in k[0] or "rejections" in k[0]}), timeout=30)
        m = scrape()
        assert m[("flotilla_operator_pass_duration_seconds_count", ())] >= 1
        assert m[("flotilla_operator_pass_duration_seconds_sum", ())] > 0
        assert m[("flotilla_operator_passes_total", (("kind", "first"),))] == 1
        assert m[("flotilla_operator_api_requests_total", ())] >= 2  # the two status patches at least
        assert m[("flotilla_operator_view_objects", (("kind", "jobs"),))] == 2
        assert sum(v for (name, labels), v in m.items() if name == "flotilla_operator_rejections_total") == 1
        assert "deadline" in get("trainingjob", "hopeless", namespace)["status"]["message"]
    finally:
        op.stop()
