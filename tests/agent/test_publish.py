"""Publishing: Redis Streams (real redis-server) and HTTP (a tiny local server), through the bounded buffer."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from flotilla.agent.publish import BufferedPublisher, HttpTransport, PublishError, RedisTransport
from flotilla.health.samples import FIELD, decode_batch, Sample


def samples(n: int, start: int = 0) -> list[Sample]:
    return [Sample(float(start + i), "n1", "heartbeat", 1.0) for i in range(n)]


def stream_samples(url: str, stream: str) -> list[Sample]:
    client = redis.Redis.from_url(url)
    return [s for _id, fields in client.xrange(stream) for s in decode_batch(fields[FIELD.encode()])]


@pytest.mark.redis
def test_redis_batches_are_xadded_and_the_stream_is_trimmed(redis_url):
    publisher = BufferedPublisher(RedisTransport(redis_url, stream="t:batches", maxlen=10), batch_size=3)
    publisher.add(samples(7))
    assert publisher.flush() and publisher.sent == 7
    assert [s.ts for s in stream_samples(redis_url, "t:batches")] == [float(i) for i in range(7)]
    for i in range(300):
        publisher.transport.send(samples(1, i))
    assert redis.Redis.from_url(redis_url).xlen("t:batches") < 300   # MAXLEN ~ 10 trims whole nodes


@pytest.mark.redis
def test_redis_down_buffers_drops_oldest_and_recovers_by_itself(restartable_redis):
    transport = RedisTransport(restartable_redis.url, stream="t:recover", timeout=0.5)
    publisher = BufferedPublisher(transport, capacity=5, batch_size=2)
    publisher.add(samples(3))
    assert not publisher.flush()                        # nothing listens yet
    publisher.add(samples(4, start=3))                  # 7 into a buffer of 5: the two oldest go
    assert publisher.dropped == 2 and [s.ts for s in publisher.buffer] == [2.0, 3.0, 4.0, 5.0, 6.0]
    restartable_redis.start()
    assert publisher.flush() and not publisher.buffer and not publisher.failing
    assert [s.ts for s in stream_samples(restartable_redis.url, "t:recover")] == [2.0, 3.0, 4.0, 5.0, 6.0]
    restartable_redis.stop()
    publisher.add(samples(1, start=7))
    assert not publisher.flush() and len(publisher.buffer) == 1
    restartable_redis.start()
    publisher.add(samples(1, start=8))
    assert publisher.flush()
    assert [s.ts for s in stream_samples(restartable_redis.url, "t:recover")] == [7.0, 8.0]   # a fresh server


class Ingest(BaseHTTPRequestHandler):
    """Fails the first `failures` requests with 503, then accepts; records bodies and auth headers."""

    failures = 0
    bodies: list = []
    auth: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        cls.auth.append(self.headers.get("Authorization"))
        if self.path != "/v1/ingest":
            self.send_response(404)
        elif cls.failures > 0:
            cls.failures -= 1
            self.send_response(503)
        elif cls.answers:
            self.send_response(cls.answers.pop(0))
        else:
            cls.bodies.append(json.loads(body))
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def ingest_server():
    handler = type("Handler", (Ingest,), {"failures": 0, "answers": [], "bodies": [], "auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_http_retries_with_exponential_backoff_and_sends_the_token(ingest_server, tmp_path):
    url, handler = ingest_server
    handler.failures = 2
    (tmp_path / "token").write_text("s3cret\n")
    sleeps = []
    transport = HttpTransport(url, "n1", token_file=tmp_path / "token", retries=3, backoff=0.1, sleep=sleeps.append)
    transport.send(samples(2))
    assert sleeps == [0.1, 0.2]
    assert handler.auth == ["Bearer s3cret"] * 3
    assert handler.bodies == [{"node": "n1", "samples": [s.to_dict() for s in samples(2)]}]


def test_http_gives_up_after_the_retries_and_the_buffer_keeps_the_samples(ingest_server):
    url, handler = ingest_server
    handler.failures = 10
    transport = HttpTransport(url, "n1", retries=2, backoff=0.01, sleep=lambda s: None)
    with pytest.raises(PublishError, match="HTTP 503"):
        transport.send(samples(1))
    publisher = BufferedPublisher(transport, capacity=10)
    publisher.add(samples(3))
    assert not publisher.flush() and len(publisher.buffer) == 3
    handler.failures = 0
    assert publisher.flush() and handler.bodies[0]["samples"][0]["ts"] == 0.0


def test_a_refused_batch_is_dropped_and_counted_and_the_samples_behind_it_get_through(ingest_server):
    url, handler = ingest_server
    handler.answers = [403]
    transport = HttpTransport(url, "n1", retries=3, backoff=0.01, sleep=lambda s: None)
    publisher = BufferedPublisher(transport, capacity=10, batch_size=2)
    publisher.add(samples(5))
    assert not publisher.flush()  # the first batch is refused, once (no retry), and dropped
    assert publisher.refused == 2 and [s.ts for s in publisher.buffer] == [2.0, 3.0, 4.0]
    assert publisher.flush() and not publisher.buffer
    assert [s["ts"] for body in handler.bodies for s in body["samples"]] == [2.0, 3.0, 4.0]
    assert handler.answers == [] and len(handler.auth) == 3


@pytest.mark.parametrize("status", [429, 408])
def test_a_busy_or_timed_out_controller_is_not_a_refusal(ingest_server, status):
    url, handler = ingest_server
    handler.answers = [status] * 5
    transport = HttpTransport(url, "n1", retries=1, backoff=0.01, sleep=lambda s: None)
    publisher = BufferedPublisher(transport, capacity=10)
    publisher.add(samples(2))
    assert not publisher.flush() and len(publisher.buffer) == 2 and publisher.refused == 0
    handler.answers = []
    assert publisher.flush() and len(handler.bodies) == 1


def test_http_controller_down_is_a_publish_error():
    from flotilla.testing.services import free_port
    transport = HttpTransport(f"http://127.0.0.1:{free_port()}", "n1", retries=1, backoff=0.01, sleep=lambda s: None)
    with pytest.raises(PublishError, match="controller: ConnectError"):
        transport.send(samples(1))


def test_buffer_rejects_a_zero_capacity():
    with pytest.raises(ValueError, match="capacity"):
        BufferedPublisher(RedisTransport("redis://127.0.0.1:1/0"), capacity=0)


@pytest.mark.redis
def test_redis_entries_carry_the_token_read_at_every_send(redis_url, tmp_path):
    from flotilla.health.samples import TOKEN_FIELD

    token = tmp_path / "token"
    token.write_text("projected-1\n")
    transport = RedisTransport(redis_url, stream="t:token", token_file=token)
    transport.send(samples(1))
    token.write_text("projected-2\n")  # the kubelet rotated it
    transport.send(samples(1))
    entries = redis.Redis.from_url(redis_url).xrange("t:token")
    assert [fields[TOKEN_FIELD.encode()] for _, fields in entries] == [b"projected-1", b"projected-2"]
    token.unlink()
    with pytest.raises(PublishError, match="cannot read the token file"):
        transport.send(samples(1))  # kept in the buffer, sent once the token is back


def make_ca_and_server_cert(tmp_path):
    """A CA and a localhost serving certificate signed by it (openssl), as the chart's genCA/genSignedCert make."""
    import subprocess

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.csr"))
    (tmp_path / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(tmp_path / "tls.csr"), "-CA", str(tmp_path / "ca.crt"), "-CAkey",
            str(tmp_path / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(tmp_path / "ext"),
            "-out", str(tmp_path / "tls.crt"))
    return tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key"


def test_https_controller_is_verified_against_the_ca_file(tmp_path):
    import ssl

    ca, cert, key = make_ca_and_server_cert(tmp_path)
    handler = type("Handler", (Ingest,), {"failures": 0, "answers": [], "bodies": [], "auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        HttpTransport(url, "n1", ca_file=ca, retries=0).send(samples(1))
        assert len(handler.bodies) == 1
        with pytest.raises(PublishError, match="CERTIFICATE_VERIFY_FAILED"):
            HttpTransport(url, "n1", retries=0).send(samples(1))  # the system trust store does not know our CA
    finally:
        server.shutdown()
        server.server_close()
