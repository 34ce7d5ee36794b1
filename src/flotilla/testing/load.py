"""Completions at a constant rate to an OpenAI-compatible endpoint, open loop (a request is sent on time
whether or not earlier ones have answered), the rate changeable while it runs: the demo's traffic. The test
suite drives serving with guidellm (e2e/test_serving_traffic.py); this is the small stand-in that needs
nothing beyond httpx.

Prompts are `prompt_tokens` words, which the engine doubles (flotilla.testing.engine) count one token each.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx


class ConstantLoad:
    def __init__(self, url: str, rate: float, prompt_tokens: int, output_tokens: int, model: str = "demo",
                 timeout_s: float = 60.0) -> None:
        if rate <= 0:
            raise ValueError(f"rate: must be > 0, got {rate}")
        self.url, self.rate, self.timeout_s = url.rstrip("/"), rate, timeout_s
        self.body = {"model": model, "prompt": " ".join(["w"] * prompt_tokens), "max_tokens": output_tokens}
        self.sent = self.answered = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "ConstantLoad":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 5)

    async def _run(self) -> None:
        pending: set[asyncio.Task] = set()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as http:
            due = time.monotonic()
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(http))
                pending.add(task)
                task.add_done_callback(pending.discard)
                self.sent += 1
                due += 1.0 / self.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if time.monotonic() - due > 5.0:  # a stalled machine: do not send the missed seconds in a burst
                    due = time.monotonic()
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _one(self, http: httpx.AsyncClient) -> None:
        try:
            r = await http.post(f"{self.url}/v1/completions", json=self.body)
            if r.status_code == 200:
                self.answered += 1
                return
        except httpx.HTTPError:
            pass
        self.failed += 1
