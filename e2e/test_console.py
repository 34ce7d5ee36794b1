"""The console in a real headless Chromium, against the controller on a real API server with examples/ running.

* every page loads with the cluster's real objects (and a screenshot of each is saved);
* the GPU map shows the running job's GPUs on the nodes its status.placement names;
* an uncorrectable ECC error on one GPU, injected by a node agent, marks that GPU out of service in the map within
  10 s of the fault (the node stays in service with its other GPUs; its page names the GPU and why);
* an admin drains a node from the UI (confirmation, the API's answer shown); the job moves off it through a
  checkpoint and its reshard appears on the Decisions page; an admin changes a job's priority from its page;
* a read token sees no action button, and the API refuses it the action.

Screenshots go to $FLOTILLA_E2E_LOGS/console/ (or the session's log folder, printed); with
FLOTILLA_UPDATE_SCREENSHOTS=1 the GPU map and the training timeline are also written to docs/ for the README.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
import uuid

import pytest

from e2e.kube import (
    ROOT,
    FlotillaProcess,
    SimulatedWorkersProcess,
    controller_api,
    get,
    kubectl,
    wait_for,
    wait_for_gpus_free_outside,
)
from flotilla.resources import names
from flotilla.testing import browser
from flotilla.testing.services import redis_server

OPERATOR_ARGS = ("--policy", "elastic-deadline")
pytestmark = pytest.mark.skipif(browser.available() is not None,
                                reason=f"the browser tests need {browser.available()}")
READ = secrets.token_hex(16)


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture(scope="module")
def shots(log_dir):
    d = log_dir / "console"
    d.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {d}")
    return d


@pytest.fixture(scope="module")
def cluster_with_examples(operator, redis_url, log_dir, tmp_path_factory):
    """examples/ applied in a namespace of their own, simulated workers, and the controller with a read and an
    admin token; yields (namespace, admin API client, base URL)."""
    ns = f"e2e-console-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    sim = None
    try:
        wait_for_gpus_free_outside(ns, timeout=180)
        sim = SimulatedWorkersProcess(log_dir / f"simworkers-{ns}.log", ns).start()
        kubectl("apply", "-n", ns, "-f", str(ROOT / "examples"))
        with controller_api(log_dir, tmp_path_factory.mktemp("console"), "--redis-url", redis_url,
                            more_tokens=f"{READ},read,e2e-viewer\n") as api:
            wait_for("llama-ft running on its GPUs", lambda: running("llama-ft", ns), timeout=90)
            yield ns, api, str(api.base_url).rstrip("/")
    finally:
        if sim is not None:
            sim.stop()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def running(name: str, ns: str) -> dict | None:
    status = (get("trainingjob", name, ns) or {}).get("status", {})
    return status if status.get("phase") == "Running" and status.get("placement") else None


@pytest.fixture(scope="module")
def admin_browser(cluster_with_examples):
    _, api, base = cluster_with_examples
    admin = api.headers["Authorization"].split()[-1]
    with browser.chromium() as driver:
        browser.sign_in(driver, base, admin)
        yield driver


def by_css(driver, selector):
    return driver.find_elements("css selector", selector)


def click(driver, selector: str, what: str) -> None:
    """Click the element now matching `selector` (a poll may have redrawn the page since it was found)."""
    browser.wait(driver, lambda d: by_css(d, selector)[0].click() or True, what)


def open_page(driver, base: str, fragment: str, ready: str, what: str):
    driver.get(f"{base}/ui/{fragment}")
    return browser.wait(driver, lambda d: by_css(d, ready), what, timeout=20)


def map_holders(driver) -> dict[str, dict[str, int]]:
    """node -> {holder: GPU cells} as the drawn GPU map shows them."""
    return driver.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll('#gpumap .node')) {
          const cells = {};
          for (const c of row.querySelectorAll('.cell[data-holder]')) cells[c.dataset.holder] = (cells[c.dataset.holder] || 0) + 1;
          out[row.dataset.node] = cells;
        }
        return out;""")


def node_state_in_map(driver, node: str) -> str | None:
    return driver.execute_script("const r = document.querySelector(`#gpumap .node[data-node='${arguments[0]}']`);"
                                 "return r ? r.dataset.state : null;", node)


def test_every_page_shows_the_clusters_objects_and_the_map_puts_the_job_on_its_nodes(
        cluster_with_examples, admin_browser, shots):
    ns, api, base = cluster_with_examples
    d = admin_browser
    placement = {p["node"]: p["gpus"] for p in running("llama-ft", ns)["placement"]}

    open_page(d, base, "#/map", "#gpumap .node", "the GPU map")
    shown = browser.wait(d, lambda d: (m := map_holders(d)) and all(
        m.get(n, {}).get(f"{ns}/llama-ft") == g for n, g in placement.items()) and m, "llama-ft's cells on its nodes")
    for node, holders in shown.items():  # and nowhere else
        assert holders.get(f"{ns}/llama-ft", 0) == placement.get(node, 0), (node, holders, placement)
    nodes = {n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    assert set(shown) == nodes
    # The serving pods' GPUs are drawn as serving once they are placed.
    browser.wait(d, lambda d: by_css(d, f"#gpumap .cell[data-holder='{ns}/chat'][data-kind=serving]"),
                 "chat's serving GPUs in the map", timeout=60)
    cell = by_css(d, f"#gpumap .cell[data-holder='{ns}/llama-ft']")[0]
    assert f"{ns}/llama-ft" in cell.get_attribute("title")  # what hovering shows
    d.save_screenshot(str(shots / "gpu-map.png"))
    click(d, f"#gpumap .cell[data-holder='{ns}/llama-ft']", "a GPU cell of llama-ft")  # opens the job
    browser.wait(d, lambda d: by_css(d, "[data-field=phase]") and d.current_url.endswith(f"#/training/{ns}/llama-ft"),
                 "the job's page from its GPU cell")
    d.save_screenshot(str(shots / "job.png"))

    open_page(d, base, "#/training", f"tr[data-job='{ns}/llama-ft']", "the training page")
    browser.wait(d, lambda d: by_css(d, f"#timeline rect[data-job='{ns}/llama-ft']"), "llama-ft in the timeline")
    row = by_css(d, f"tr[data-job='{ns}/resnet50']")[0].text
    assert "Running" in row or "Admitted" in row, row
    d.set_window_size(1440, 1100)  # the timeline and the job table in one picture
    d.save_screenshot(str(shots / "training.png"))
    d.set_window_size(1440, 900)

    open_page(d, base, "#/serving", f"tr[data-serving='{ns}/chat']", "the serving page")
    assert "1:2" in by_css(d, f"tr[data-serving='{ns}/chat']")[0].text  # examples/: fixed, 1 prefill, 2 decode
    d.save_screenshot(str(shots / "serving.png"))

    # Teams: the queues the cluster has (or the implicit queue's sentence when it has none).
    open_page(d, base, "#/queues", "main h2", "the teams page")
    browser.wait(d, lambda d: by_css(d, "table[aria-label=queues]") or "No Queue objects" in
                 d.find_element("css selector", "main").text, "the teams page's queues")
    d.save_screenshot(str(shots / "teams.png"))

    open_page(d, base, "#/nodes", "table[aria-label=nodes] tbody tr", "the nodes page")
    assert {r.get_attribute("data-node") for r in by_css(d, "table[aria-label=nodes] tbody tr")} == nodes
    d.save_screenshot(str(shots / "nodes.png"))
    node = sorted(placement)[0]
    open_page(d, base, f"#/nodes/{node}", "[data-field=state]", "a node's page")
    assert f"{ns}/llama-ft" in d.find_element("css selector", "main").text
    d.save_screenshot(str(shots / "node.png"))

    # A controller that just started has seen no change yet: an empty trail is "No decisions." (the drain test
    # below checks entries and takes the page's screenshot).
    open_page(d, base, "#/decisions", "form[aria-label='filter decisions']", "the decisions page")
    if os.environ.get("FLOTILLA_UPDATE_SCREENSHOTS"):
        for name in ("gpu-map", "training"):
            shutil.copy(shots / f"{name}.png", ROOT / "docs" / f"console-{name}.png")


def test_an_injected_gpu_fault_shows_that_gpu_out_of_service_in_the_map_within_10_s(
        cluster_with_examples, admin_browser, redis_url, log_dir, tmp_path, shots):
    """An uncorrectable ECC error on GPU 0 of a job's node: a fault of that GPU alone, so the map marks that GPU
    out of service at its index and the node stays in service with its other GPUs."""
    ns, api, base = cluster_with_examples
    d = admin_browser
    nodes = sorted(p["node"] for p in running("resnet50", ns)["placement"]) or sorted(
        p["node"] for p in running("llama-ft", ns)["placement"])
    faulty = nodes[0]
    everyone = sorted(n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"])
    open_page(d, base, "#/map", "#gpumap .node", "the GPU map")
    assert node_state_in_map(d, faulty) == "ok"
    truth = tmp_path / "faults.jsonl"
    agents = []
    try:
        for n in everyone:
            extra = ["--inject", "ecc_error@3#0", "--ground-truth", str(truth)] if n == faulty else []
            agents.append(FlotillaProcess(log_dir / f"agent-console-{n}.log", "agent", "--node", n, "--source", "sim",
                                          "--redis-url", redis_url, "--interval", "0.5", "--step-port", "0",
                                          *extra).start())
        cell = f"#gpumap .node[data-node='{faulty}'] .cell.gpuout[data-gpu='0']"
        browser.wait(d, lambda d: d.find_elements("css selector", cell), f"GPU 0 of {faulty} out of service in the map",
                     timeout=60, interval=0.2)
        seen = time.time()
        fault_at = min(json.loads(line)["start"] for line in truth.read_text().splitlines() if line.strip())
        print(f"{faulty} GPU 0: fault at {fault_at:.1f}, out of service in the map {seen - fault_at:.1f} s later")
        assert seen - fault_at <= 10.0, f"the map showed the fault {seen - fault_at:.1f} s after it happened"
        assert "out of service" in by_css(d, cell)[0].get_attribute("aria-label")
        assert all(node_state_in_map(d, n) == "ok" for n in everyone)  # one GPU out: no node leaves service
        d.save_screenshot(str(shots / "gpu-map-fault.png"))
        # The node's page names the GPU and why, and shows the detector's evidence: the metric, over which window.
        open_page(d, base, f"#/nodes/{faulty}", ".evidence dl", "the detector's evidence")
        evidence = by_css(d, ".evidence")[0].text
        assert "metric" in evidence and "window" in evidence, evidence
        assert "GPU 0" in d.find_element("css selector", "[data-field=gpus-out]").text
        d.save_screenshot(str(shots / "node-gpu-out.png"))
    finally:
        for a in agents:
            a.stop()
        # Silent agents read as lost heartbeats: every node that had one goes back to service explicitly.
        for n in everyone:
            api.post(f"/v1/nodes/{n}/return-to-service", json={"reason": "e2e console: agents stopped"})
    wait_for(f"{faulty} back in service", lambda: not ((n := get("node", faulty, "default") or {}).get("spec", {})
                                                       .get("taints")) and names.ANNOTATION_UNHEALTHY_GPUS not in
             (n.get("metadata", {}).get("annotations") or {}), timeout=30)


def test_an_admin_drains_a_node_from_the_ui_and_the_reshard_shows_in_decisions(cluster_with_examples, admin_browser,
                                                                              shots):
    ns, api, base = cluster_with_examples
    d = admin_browser
    job = wait_for("llama-ft running", lambda: running("llama-ft", ns), timeout=120)
    before = job.get("reshards", 0)
    node = job["placement"][0]["node"]
    open_page(d, base, f"#/nodes/{node}", "#act-drain", "the drain button")
    try:
        click(d, "#act-drain", "the drain button")
        text = browser.wait(d, lambda d: d.find_element("id", "confirm-text").text, "the confirmation")
        assert node in text and "checkpoint" in text and f"{ns}/llama-ft" in text, text
        click(d, "#confirm-ok", "Confirm")
        status = browser.wait(d, lambda d: by_css(d, "#answer [data-answer-status]")[0].get_attribute(
            "data-answer-status"), "the API's answer")
        assert status == "202", d.find_element("id", "answer").text
        assert f"{ns}/llama-ft" in d.find_element("id", "answer").text  # the checkpoint request it made
        click(d, "#answer button", "Close")

        moved = wait_for("llama-ft moved off the drained node", lambda: (s := running("llama-ft", ns)) and node not in
                         {p["node"] for p in s["placement"]} and s.get("reshards", 0) > before and s, timeout=120)
        assert moved["checkpoint"]["generation"] >= 1
        open_page(d, base, "#/decisions", "table[aria-label=decisions] tbody tr", "the decisions page")
        browser.wait(d, lambda d: by_css(d, f"tr[data-kind=reshard][data-object='{ns}/llama-ft']")
                     and by_css(d, f"tr[data-kind=drain][data-object='{node}']"), "the reshard and drain in Decisions",
                     timeout=30)
        d.save_screenshot(str(shots / "decisions.png"))
        link = by_css(d, f"tr[data-kind=reshard][data-object='{ns}/llama-ft'] a")[0]
        assert link.get_attribute("href").endswith(f"#/training/{ns}/llama-ft")
    finally:
        api.post(f"/v1/nodes/{node}/return-to-service", json={"reason": "e2e console done"})
        kubectl("uncordon", node, check=False)


def test_an_admin_changes_a_jobs_priority_from_the_ui(cluster_with_examples, admin_browser):
    ns, api, base = cluster_with_examples
    d = admin_browser
    open_page(d, base, f"#/training/{ns}/resnet50", "#new-priority", "the job's actions")
    field = by_css(d, "#new-priority")[0]
    field.clear()
    field.send_keys("7")
    # The page redraws at a poll whenever the job changed (its progress moves): what was typed must survive it
    # (in CI's run the job is redrawn here; before the console kept typed values, the priority sent was 0).
    time.sleep(2.5)
    assert by_css(d, "#new-priority")[0].get_property("value") == "7"
    click(d, "#new-priority ~ button, form:has(#new-priority) button[type=submit]", "Change priority")
    text = browser.wait(d, lambda d: d.find_element("id", "confirm-text").text, "the confirmation")
    assert f"{ns}/resnet50" in text and "to 7" in text, text
    click(d, "#confirm-ok", "Confirm")
    status = browser.wait(d, lambda d: by_css(d, "#answer [data-answer-status]")[0].get_attribute(
        "data-answer-status"), "the API's answer")
    assert status == "200", d.find_element("id", "answer").text
    click(d, "#answer button", "Close")
    assert wait_for("spec.priority 7", lambda: (get("trainingjob", "resnet50", ns) or {}).get("spec", {})
                    .get("priority") == 7, timeout=20)


def test_a_read_token_sees_no_action_and_the_api_refuses_it(cluster_with_examples):
    import httpx

    ns, api, base = cluster_with_examples
    node = running("llama-ft", ns)["placement"][0]["node"] if running("llama-ft", ns) else None
    node = node or json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"][0]["metadata"]["name"]
    with browser.chromium() as d:
        browser.sign_in(d, base, READ)
        assert d.execute_script("return document.body.dataset.role") == "read"
        open_page(d, base, f"#/nodes/{node}", "[data-field=state]", "a node's page")
        assert not by_css(d, "#act-drain") and not by_css(d, "#act-return")
        open_page(d, base, f"#/training/{ns}/llama-ft", "[data-field=phase]", "the job's page")
        assert not by_css(d, "#act-checkpoint") and not by_css(d, "#new-deadline")
        # The token lives in the tab's session storage, never in the URL.
        assert READ not in d.current_url
    r = httpx.post(f"{base}/v1/nodes/{node}/drain", json={"reason": "a viewer tries"},
                   headers={"Authorization": f"Bearer {READ}"})
    assert r.status_code == 403, r.text
    r = httpx.post(f"{base}/v1/jobs/{ns}/llama-ft/checkpoint", json={}, headers={"Authorization": f"Bearer {READ}"})
    assert r.status_code == 403, r.text
    assert not (get("node", node, "default") or {}).get("spec", {}).get("unschedulable")
