"""The controller scrapes the serving engines' /metrics (over HTTP) and turns two scrapes into a window."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flotilla.controller.actions import ClusterActionError, RecordingActions
from flotilla.controller.metrics import ControllerMetrics
from flotilla.controller.scrape import EngineScraper, ScrapeError, http_get
from flotilla.testing.services import free_port
from tests.controller.test_vllm import exposition


class Engines:
    """Real HTTP servers on loopback, one address each (127.0.0.11, ...) and one port, as pods of a pool are;
    each answers /metrics with what the test sets."""

    def __init__(self, count):
        self.port = free_port()
        self.text = [""] * count
        self.status = [200] * count
        self.servers = []
        for i in range(count):
            engines = self

            class Handler(BaseHTTPRequestHandler):
                index = i

                def do_GET(self):
                    body = engines.text[self.index].encode()
                    self.send_response(engines.status[self.index])
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *_):
                    pass

            server = ThreadingHTTPServer((self.ip(i), self.port), Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)

    @staticmethod
    def ip(i):
        return f"127.0.0.{11 + i}"

    def close(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def engines():
    e = Engines(3)
    yield e
    e.close()


def sd(port, name="chat"):
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"endpoint": {"port": port}}}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def scraper_for(actions, observed, clock, store_metrics):
    return EngineScraper(actions, lambda key, w: observed.append((key, w)), store_metrics, interval=5,
                         get=http_get(timeout=2), clock=clock)


@pytest.fixture
def metrics(tmp_path):
    from sqlalchemy import create_engine

    from flotilla.controller.db import upgrade
    from flotilla.controller.store import Store

    engine = create_engine(f"sqlite:///{tmp_path}/c.db")
    upgrade(engine)
    return ControllerMetrics(Store(engine))


def counter(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_two_scrapes_of_the_decode_endpoints_make_one_window_summed_over_pods(engines, metrics):
    actions = RecordingActions(objects={"servingdeployments": [sd(engines.port)]})
    actions.pods["ns/decode"] = [("d-0", engines.ip(0)), ("d-1", engines.ip(1))]
    observed, clock = [], Clock()
    scraper = scraper_for(actions, observed, clock, metrics)
    engines.text[0] = exposition(100, 50_000, 20_000, [(0.1, 50), ("+Inf", 100)])
    engines.text[1] = exposition(10, 5_000, 2_000, [(0.1, 5), ("+Inf", 10)])
    scraper.step()
    assert observed == []  # one scrape is no window
    clock.now += 10
    engines.text[0] = exposition(130, 62_000, 24_500, [(0.1, 60), ("+Inf", 130)])  # +30 requests, 400/150 each
    engines.text[1] = exposition(20, 9_000, 3_500, [(0.1, 10), ("+Inf", 20)])  # +10 requests, 400/150 each
    scraper.step()
    [(key, w)] = observed
    assert key == "ns/chat" and w.requests == 40 and w.requests_per_second == pytest.approx(4.0)
    assert w.mean_prompt_tokens == pytest.approx(400.0) and w.mean_output_tokens == pytest.approx(150.0)
    assert w.time == clock.now
    assert counter(metrics, "flotilla_serving_scrapes_total", result="ok") == 4


def test_a_new_pod_counts_whole_a_failed_or_restarted_one_only_gives_a_baseline(engines, metrics):
    actions = RecordingActions(objects={"servingdeployments": [sd(engines.port)]})
    pods = [("d-0", engines.ip(0)), ("d-1", engines.ip(1))]
    actions.pods["ns/decode"] = pods
    observed, clock = [], Clock()
    scraper = scraper_for(actions, observed, clock, metrics)
    engines.text[0] = exposition(100, 40_000, 10_000, [("+Inf", 100)])
    engines.text[1] = exposition(100, 40_000, 10_000, [("+Inf", 100)])
    scraper.step()
    # Round 2: d-1 fails (HTTP 500); a new pod d-2 has served 5 requests since it started.
    clock.now += 10
    engines.text[0] = exposition(110, 44_000, 11_000, [("+Inf", 110)])
    engines.status[1] = 500
    engines.text[2] = exposition(5, 2_000, 500, [("+Inf", 5)])
    actions.pods["ns/decode"] = pods + [("d-2", engines.ip(2))]
    scraper.step()
    assert observed[-1][1].requests == 15  # d-0's 10 and d-2's 5
    assert counter(metrics, "flotilla_serving_scrape_failures_total", reason="http") == 1
    # Round 3: d-1 answers again (its last scrape failed: a baseline only); d-0 restarted (counters back at 2).
    clock.now += 10
    engines.status[1] = 200
    engines.text[1] = exposition(150, 60_000, 15_000, [("+Inf", 150)])
    engines.text[0] = exposition(2, 800, 200, [("+Inf", 2)])
    engines.text[2] = exposition(12, 4_800, 1_200, [("+Inf", 12)])
    scraper.step()
    assert observed[-1][1].requests == 7  # d-2's 7 only
    clock.now += 10
    engines.text[1] = exposition(160, 64_000, 16_000, [("+Inf", 160)])
    engines.text[0] = exposition(4, 1_600, 400, [("+Inf", 4)])
    engines.text[2] = exposition(12, 4_800, 1_200, [("+Inf", 12)])
    scraper.step()
    assert observed[-1][1].requests == 12  # d-1's 10 and the restarted d-0's 2, from their baselines


def test_scrape_failures_are_logged_and_counted_and_the_loop_goes_on(engines, metrics, caplog):
    actions = RecordingActions(objects={"servingdeployments": [sd(engines.port, "chat")]})
    # chat's pods: one where nothing listens, one that answers garbage; another deployment's answers well
    actions.pods["ns/decode"] = [("d-0", "127.0.0.99"), ("d-1", engines.ip(1)), ("o-0", engines.ip(0))]
    engines.text[1] = "this is { not prometheus"
    engines.text[0] = exposition(1, 400, 100, [("+Inf", 1)])
    observed, clock = [], Clock()
    scraper = scraper_for(actions, observed, clock, metrics)
    scraper.step()
    clock.now += 10
    engines.text[0] = exposition(11, 4_400, 1_100, [("+Inf", 11)])
    scraper.step()
    assert [w.requests for _, w in observed] == [10]  # the pods that answered still make a window
    assert counter(metrics, "flotilla_serving_scrape_failures_total", reason="connect") == 2
    assert counter(metrics, "flotilla_serving_scrape_failures_total", reason="parse") == 2
    assert "serving scrape failed (connect)" in caplog.text
    actions.fail = ClusterActionError("servingdeployments: 403 Forbidden")
    with pytest.raises(ClusterActionError):
        scraper.step()  # listing the ServingDeployments failed: run() logs it and goes on


def test_a_pod_lookup_failure_is_counted_per_deployment(metrics):
    class NoPods(RecordingActions):
        def ready_pods(self, namespace, selector):
            raise ClusterActionError(f"pods in {namespace}: 403 Forbidden")

    actions = NoPods(objects={"servingdeployments": [sd(8000)]})
    EngineScraper(actions, lambda *_: None, metrics, interval=5, get=http_get(1)).step()
    assert counter(metrics, "flotilla_serving_scrape_failures_total", reason="endpoints") == 1


def test_http_get_names_what_failed():
    with pytest.raises(ScrapeError) as e:
        http_get(1)(f"http://127.0.0.1:{free_port()}/metrics")
    assert e.value.reason == "connect"
