"""The console's Teams pages in a real headless Chromium, against the controller's real app (uvicorn) and a
real SQLite database holding mirrored Queues, jobs and usage history."""

import os
import threading
import time

import pytest
import uvicorn

from controller_fixtures import ADMIN, NOW, serving, training_job
from flotilla.controller.api import create_app
from flotilla.controller.mirror import parse_serving_deployment, parse_training_job
from flotilla.controller.queues import parse_queue
from flotilla.testing import browser
from flotilla.testing.services import free_port
from test_queues import in_queue, queue, reclaimed

pytestmark = [pytest.mark.skipif(browser.available() is not None,
                                 reason=f"the browser tests need {browser.available()}"),
              pytest.mark.parametrize("migrated_db_url", ["sqlite"], indirect=True)]


@pytest.fixture
def base(controller, store, clock):
    clock.now = time.time() - 3600  # the usage chart shows the last 24 hours of real time
    store.upsert_queue(parse_queue(queue("research", 16, used=16, lent=0, admitted=3)))
    store.upsert_queue(parse_queue(queue("team-a", 8, parent="research", used=8, admitted=2, guaranteed=6,
                                         namespaces=["ns-a"])))
    store.upsert_queue(parse_queue(queue("team-b", 8, parent="research", admitted=0)))
    store.upsert_job(parse_training_job(in_queue(training_job("big", "ns-a", placement={"a": 12},
                                                              deadline=NOW + 10**6), "team-a")))
    clock.now += 1800  # team B idle: team A borrows its GPUs
    store.upsert_queue(parse_queue(queue("team-a", 8, parent="research", used=12, borrowed=4, admitted=2,
                                         guaranteed=6, namespaces=["ns-a"])))
    store.upsert_queue(parse_queue(queue("team-b", 8, parent="research", lent=4)))
    clock.now += 600  # team B submits: A gives its GPUs back through a checkpoint
    store.upsert_job(parse_training_job(reclaimed("big", "team-a", {"a": 8}, since=clock.now - 40,
                                                  deadline=NOW + 10**6, namespace="ns-a")))
    store.upsert_job(parse_training_job(in_queue(training_job("late", "ns-b", placement={"b": 4}, deadline_met=False,
                                                              deadline=NOW + 10**6), "team-b")))
    store.upsert_serving(parse_serving_deployment(in_queue(serving("chat", "ns-b", prefill=1, decode=1), "team-b")))
    store.upsert_queue(parse_queue(queue("team-a", 8, parent="research", used=8, admitted=2, guaranteed=6,
                                         namespaces=["ns-a"])))
    store.upsert_queue(parse_queue(queue("team-b", 8, parent="research", used=7, admitted=2, guaranteed=4)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(controller), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def text_of(driver, selector):
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                                 selector)


def test_teams_pages(base):
    with browser.chromium() as d:
        browser.sign_in(d, base, ADMIN)
        d.get(f"{base}/ui/#/queues")
        rows = browser.wait(d, lambda d: d.execute_script(
            "return [...document.querySelectorAll('tr[data-queue]')].map(r => r.dataset.queue)") or None, "the queues")
        assert rows == ["research", "team-a", "team-b"]  # a tree: each after its parent
        if shots := os.environ.get("FLOTILLA_CONSOLE_SHOTS"):
            d.save_screenshot(f"{shots}/teams.png")
        assert text_of(d, "tr[data-queue='team-b'] td[data-field='used']") == "7"
        assert "1 at-risk" in text_of(d, "tr[data-queue='team-b']")
        bar = d.execute_script("return document.querySelector(\"tr[data-queue='team-a'] .share\").getAttribute('aria-label')")
        assert bar == "team-a: nominal 8 GPUs; uses 8 (8 of its own, 0 borrowed); lends 0"
        assert d.execute_script("return document.querySelector('header nav a[data-page=queues]')"
                                ".getAttribute('aria-current')") == "page"

        d.find_element("css selector", "a[data-key='queue:team-a']").click()
        browser.wait(d, lambda d: text_of(d, "h2") == "Team team-a", "team-a's page")
        assert text_of(d, "dd[data-field='nominal']").startswith("8 GPUs guaranteed")
        assert d.execute_script("return [...document.querySelectorAll('tr[data-job]')].map(r => r.dataset.job)") == [
            "ns-a/big"]
        reclaim = browser.wait(d, lambda d: text_of(d, "tr[data-kind='reclaim']"), "the reclaim")
        assert d.execute_script("return document.querySelector(\"tr[data-kind='reclaim'] a\").getAttribute('href')") \
            == "#/training/ns-a/big"
        assert "giving 4 GPUs back to queue team-b" in reclaim
        history = d.execute_script("return [...document.querySelectorAll('tr[data-kind=loan]')].length")
        assert history == 2  # borrowed 4, gave back 4
        label = d.find_element("id", "usage").get_attribute("aria-label")
        assert label == "Over the last 24 hours: now uses 8 of a nominal 8 GPUs, borrows 0, lends 0"
        paths = d.execute_script("return [...document.querySelectorAll('#usage path.used')].map(p => p.getAttribute('d'))")
        assert paths and paths[0].count("V") == 2  # 8 -> 12 -> 8 GPUs

        if shots := os.environ.get("FLOTILLA_CONSOLE_SHOTS"):
            d.save_screenshot(f"{shots}/team-a.png")
        d.get(f"{base}/ui/#/queues/team-b")
        browser.wait(d, lambda d: text_of(d, "h2") == "Team team-b", "team-b's page")
        assert d.execute_script("return [...document.querySelectorAll('tr[data-serving]')].map(r => r.dataset.serving)") == [
            "ns-b/chat"]
        assert d.execute_script("return document.querySelector(\"tr[data-job='ns-b/late']\").dataset.outlook") == "at-risk"
        d.find_element("css selector", "tr[data-serving='ns-b/chat'] a").click()  # a deployment links its team
        browser.wait(d, lambda d: text_of(d, "dd[data-field='queue']") == "team-b", "chat's team")
        d.get(f"{base}/ui/#/queues/research")
        browser.wait(d, lambda d: text_of(d, "h2") == "Team research", "research's page")
        assert "team-a, team-b" in d.find_element("css selector", ".card").text
