"""Publishing sample batches: to Redis Streams or to the controller over HTTP, through a bounded buffer.

Both transports use the encoding of `flotilla.health.samples`. A transport
raises `PublishError` when the batch did not get through; `BufferedPublisher`
then keeps the samples (up to `capacity`, dropping the oldest and counting
them) and tries again at the next flush, so the agent recovers by itself when
the transport comes back. A batch the receiver refused for what it holds
(`Refused`: a 4xx such as 403 for another node's samples or 422 for a bad one)
is dropped and counted instead: kept at the head of the buffer, it would be
refused again at every flush and hold back every sample behind it.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, cast

import httpx
import redis

from flotilla.health.samples import FIELD, STREAM, TOKEN_FIELD, Sample, encode_batch

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    pass


class Refused(PublishError):
    """The receiver answered and refused this batch; sending the same batch again cannot succeed."""


class Transport(Protocol):
    def send(self, batch: Sequence[Sample]) -> None: ...

    def close(self) -> None: ...


def read_token(token_file: Path | None) -> str | None:
    """The bearer token, read at every send: a projected ServiceAccount token is rotated by the kubelet."""
    if token_file is None:
        return None
    try:
        return token_file.read_text().strip()
    except OSError as e:
        raise PublishError(f"cannot read the token file {token_file}: {e}") from e


class RedisTransport:
    """XADD one entry per batch to `stream`, trimming it to about `maxlen` entries. With a token file, each entry
    also carries the token (field TOKEN_FIELD): a controller with --ingest-auth tokenreview drops entries whose
    token is not bound to their samples' node."""

    def __init__(self, url: str, stream: str = STREAM, maxlen: int = 100_000, timeout: float = 2.0,
                 token_file: str | Path | None = None) -> None:
        self.stream, self.maxlen = stream, maxlen
        self.token_file = Path(token_file) if token_file else None
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def send(self, batch: Sequence[Sample]) -> None:
        entry = {FIELD: encode_batch(batch)}
        token = read_token(self.token_file)
        if token:
            entry[TOKEN_FIELD] = token
        try:
            self.client.xadd(self.stream, cast(Any, entry), maxlen=self.maxlen, approximate=True)
        except redis.RedisError as e:
            raise PublishError(f"redis: {e}") from e

    def close(self) -> None:
        self.client.close()


class HttpTransport:
    """POST /v1/ingest {"node", "samples"}; retries with exponential backoff, then gives up for this flush."""

    def __init__(self, base_url: str, node: str, token_file: str | Path | None = None, retries: int = 3,
                 backoff: float = 0.2, timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep,
                 ca_file: str | Path | None = None) -> None:
        self.node, self.retries, self.backoff, self.sleep = node, retries, backoff, sleep
        self.token_file = Path(token_file) if token_file else None
        # An https controller URL is verified against ca_file (the chart's CA), else the system's trust store.
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, verify=verify)

    def _headers(self) -> dict[str, str]:
        token = read_token(self.token_file)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def send(self, batch: Sequence[Sample]) -> None:
        body = '{"node":%s,"samples":%s}' % (json.dumps(self.node), encode_batch(batch))
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = self.client.post("/v1/ingest", content=body,
                                     headers={"Content-Type": "application/json", **self._headers()})
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if r.status_code < 300:
                return
            error = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code < 500 and r.status_code not in (408, 429):
                raise Refused(f"controller: {error}")
        raise PublishError(f"controller: {error}")

    def close(self) -> None:
        self.client.close()


class BufferedPublisher:
    """A bounded FIFO of samples in front of a transport."""

    def __init__(self, transport: Transport, capacity: int = 100_000, batch_size: int = 5_000) -> None:
        if capacity < 1 or batch_size < 1:
            raise ValueError("buffer capacity and batch size must be at least 1")
        self.transport, self.batch_size = transport, batch_size
        self.buffer: deque[Sample] = deque(maxlen=capacity)
        self.dropped = 0   # the oldest samples, pushed out of a full buffer
        self.refused = 0   # samples in batches the receiver refused
        self.sent = 0
        self.failing = False
        self.refusing = False

    def add(self, samples: Sequence[Sample]) -> None:
        overflow = len(self.buffer) + len(samples) - (self.buffer.maxlen or 0)
        if overflow > 0:
            self.dropped += overflow
        self.buffer.extend(samples)

    def flush(self) -> bool:
        """Send everything buffered, oldest first; stop at the first failure. True when the buffer is empty."""
        while self.buffer:
            batch = [self.buffer[i] for i in range(min(self.batch_size, len(self.buffer)))]
            try:
                self.transport.send(batch)
            except Refused as e:
                for _ in batch:
                    self.buffer.popleft()
                self.refused += len(batch)
                if not self.refusing:
                    log.error("the receiver refused a batch of %d samples; dropped it and going on with the next "
                              "(logged again when a batch gets through): %s", len(batch), e)
                self.refusing = True
                return False   # the next batch waits for the next flush: a refusing receiver is not hammered
            except PublishError as e:
                if not self.failing:
                    log.warning("publishing failed, buffering (%d samples held, %d dropped so far): %s",
                                len(self.buffer), self.dropped, e)
                self.failing = True
                return False
            for _ in batch:
                self.buffer.popleft()
            self.sent += len(batch)
            if self.failing:
                log.info("publishing recovered; %d samples dropped while it was down", self.dropped)
                self.failing = False
            if self.refusing:
                log.info("the receiver accepts batches again; %d samples refused so far", self.refused)
                self.refusing = False
        return True
