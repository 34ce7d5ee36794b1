"""An HTTP engine double: it stands in for vLLM in tests, it is not vLLM and runs no model.

It speaks the part of vLLM's OpenAI-compatible server that routers, load generators and Flotilla's
controller use, over real HTTP:

* `POST /v1/completions` (a `prompt` string, whose whitespace-separated words are its tokens, or a list
  of token ids; `max_tokens`, default 16; `stream` true or false). The text is "tok" words, as many as
  `max_tokens` (the double never stops early), and `usage` says how many tokens each side had.
* `GET /v1/models`, `GET /health`, and `GET /metrics`: vLLM's Prometheus metric names
  (flotilla.testing.engine.core.Metrics).

Latencies come from flotilla.testing.engine.core's iteration-level scheduling (continuous batching
under a token budget, chunked prefill when colocated, a KV-cache capacity, DistServe's published
OPT-13B A100 per-iteration times), played in real time: the engine loop schedules an iteration, sleeps
its duration, then delivers its tokens. Nothing here reads the planner's latency model.

Roles, as llm-d deploys vLLM:
* `colocated`: one engine does both phases.
* `prefill`: computes the prompt and answers with the first token once its KV cache would have reached
  the decode instance (the core's transfer time); what vLLM's prefill instance does for a request with
  `kv_transfer_params.do_remote_decode`.
* `decode`: first calls a prefill instance, as llm-d's routing sidecar on decode pods does: the one named
  by the `x-prefiller-host-port` header (llm-d's endpoint picker sets it) if present, else the prefill
  Service (`--prefill-url`). Then it generates the other tokens. TTFT counts from the request's arrival
  here to the prefill's answer, so the decode instance's metrics are the request's as its client sees
  them, and each request is counted once, where it finishes.

    python -m flotilla.testing.engine.server --role decode --tp 1 --host 127.64.0.7 --port 8000 \\
        --prefill-url http://127.0.0.1:40123
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from flotilla.testing.engine.core import PROFILES, ROLES, Engine, Request

log = logging.getLogger("flotilla.engine")
MAX_LAG_S = 0.5  # further behind than this (a stalled machine), the engine's clock jumps to now
PREFILLER_HEADER = "x-prefiller-host-port"  # llm-d's endpoint picker names the prefill pod in it


class BadRequest(ValueError):
    pass


def prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        n = len(prompt.split())
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        n = len(prompt)
    else:
        raise BadRequest("prompt: a string or a list of token ids")
    if n < 1:
        raise BadRequest("prompt: empty")
    return n


def max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens", 16)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"max_tokens: a positive integer, got {value!r}")
    return value


class EngineLoop:
    """Runs an Engine in real time: requests in, their finished (or handed-off) Request out."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.wake = asyncio.Event()
        self.done: dict[str, asyncio.Future] = {}
        self.first: dict[str, asyncio.Future] = {}
        self.last_add = float("-inf")

    def submit(self, request: Request, now: float) -> tuple[asyncio.Future, asyncio.Future]:
        """(first token, done) futures: prefill's `done` resolves when the KV would have reached decode."""
        loop = asyncio.get_running_loop()
        first, done = loop.create_future(), loop.create_future()
        self.first[request.id], self.done[request.id] = first, done
        self.engine.add(request, now)
        self.last_add = now
        self.wake.set()
        return first, done

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_end = float("-inf")
        while True:
            # Back to back, an iteration starts where the last one ended (or at the latest arrival), not
            # when this loop got round to it: the double's own overhead is not the engine's latency.
            now = time.monotonic()
            start = max(last_end, self.last_add) if now - last_end < MAX_LAG_S else now
            iteration = self.engine.step(start)
            if iteration is None:
                self.wake.clear()
                await self.wake.wait()
                continue
            last_end = iteration.end
            await asyncio.sleep(max(0.0, iteration.end - time.monotonic()))
            for r in iteration.first_tokens:
                _resolve(self.first.pop(r.id, None), r)
            for r in iteration.finished:
                _resolve(self.done.pop(r.id, None), r)
            for h in iteration.handoffs:
                loop.call_later(max(0.0, h.ready_at - time.monotonic()), _resolve, self.done.pop(h.request.id, None),
                                h.request)
                _resolve(self.first.pop(h.request.id, None), h.request)


def _resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def completion(body: dict[str, Any], rid: str, prompt: int, tokens: int, model: str, finish: str | None,
               text: str | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": body.get("model") or model,
            "choices": [{"index": 0, "text": " tok" * tokens if text is None else text, "logprobs": None,
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}}


def create_app(role: str, tp: int, model: str, profile: str, prefill_url: str | None = None,
               max_num_batched_tokens: int = 2048) -> Starlette:
    engine = Engine(role, tp, PROFILES[profile], max_num_batched_tokens=max_num_batched_tokens)  # type: ignore[arg-type]
    runner = EngineLoop(engine)
    ids = itertools.count()
    state: dict[str, Any] = {}

    async def startup() -> None:
        state["loop"] = asyncio.get_running_loop().create_task(runner.run())
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0),
                                            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256))

    async def shutdown() -> None:
        state["loop"].cancel()
        await state["client"].aclose()

    async def prefill_remote(request: HttpRequest, body: dict[str, Any]) -> None:
        """The routing sidecar's first leg: the prefill instance computes the prompt and hands over its KV."""
        target = request.headers.get(PREFILLER_HEADER)
        url = f"http://{target}" if target else prefill_url
        if not url:
            raise BadRequest("no prefill instance: no --prefill-url and no x-prefiller-host-port header")
        # (llm-d's sidecar also sets max_tokens=1; the double keeps the request's own, so that the prefill
        # engine hands it over rather than finishing it there, and the request is counted once, at decode.)
        leg = {**body, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        r = await state["client"].post(f"{url.rstrip('/')}/v1/completions", json=leg)
        if r.status_code != 200:
            raise RuntimeError(f"prefill at {url} answered {r.status_code}: {r.text[:200]}")

    async def serve(request: HttpRequest, body: dict[str, Any]) -> tuple[Request, asyncio.Future, asyncio.Future]:
        """Runs the request through this instance's role; returns it with its first-token and done futures."""
        arrival = time.monotonic()
        r = Request(f"{role}-{next(ids)}", prompt_tokens(body), max_tokens(body))
        if role != "decode":
            return (r, *runner.submit(r, arrival))
        await prefill_remote(request, body)
        now = time.monotonic()
        r.arrival, r.first_token_at, r.generated = arrival, now, 1
        first = asyncio.get_running_loop().create_future()
        first.set_result(r)
        if r.max_tokens == 1:  # nothing left to decode: done here
            r.finished_at = now
            engine.metrics.finish(r)
            return r, first, first
        _, done = runner.submit(r, now)
        runner.first.pop(r.id, None)  # its first token came from the prefill instance
        return r, first, done

    async def completions(request: HttpRequest) -> Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            r, first, done = await serve(request, body)
        except (BadRequest, ValueError) as e:
            return JSONResponse({"error": {"message": str(e), "type": "BadRequestError", "code": 400}}, 400)
        except (httpx.HTTPError, RuntimeError) as e:
            log.warning("prefill failed: %s", e)
            return JSONResponse({"error": {"message": f"prefill failed: {e}", "type": "ServiceUnavailable",
                                           "code": 503}}, 503)
        rid = f"cmpl-{uuid.uuid4().hex}"
        produced = 1 if role == "prefill" else r.max_tokens
        if not body.get("stream"):
            await done
            return JSONResponse(completion(body, rid, r.prompt_tokens, produced, model, "length"))

        async def events() -> AsyncIterator[str]:
            # The first token when it is made, the rest when the request finishes (one chunk: a client
            # measures TTFT at the first and the mean inter-token time over the rest).
            await first
            yield f"data: {json.dumps(completion(body, rid, r.prompt_tokens, 1, model, None, ' tok'))}\n\n"
            await done
            last = completion(body, rid, r.prompt_tokens, produced - 1, model, "length")
            last["usage"] = {"prompt_tokens": r.prompt_tokens, "completion_tokens": produced,
                             "total_tokens": r.prompt_tokens + produced}
            yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(_: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "flotilla-test",
                                                         "max_model_len": 4096}]})

    async def health(_: HttpRequest) -> Response:
        return Response(status_code=200)

    async def metrics(_: HttpRequest) -> Response:
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await startup()
        try:
            yield
        finally:
            await shutdown()

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)],
                     lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="An engine double that stands in for vLLM (see the module doc).")
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--tp", type=int, default=1, help="GPUs of the instance (tensor parallelism)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="opt-13b")
    parser.add_argument("--profile", default="opt-13b-a100-distserve", choices=sorted(PROFILES))
    parser.add_argument("--prefill-url", help="decode role: the prefill Service's address")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app = create_app(args.role, args.tp, args.model, args.profile, args.prefill_url, args.max_num_batched_tokens)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
