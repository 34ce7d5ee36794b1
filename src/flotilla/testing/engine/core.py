"""The scheduling core of an LLM engine double: it stands in for vLLM, it is not vLLM.

Latencies come from this module's own iteration-level scheduling of requests, priced by published
per-iteration kernel timings. It imports nothing of `flotilla.serving` (the planner's latency model),
so the planner's error measured against it is not zero by construction (tests/test_import_contracts.py
holds that rule).

Profile (`OPT_13B_A100`, the default). DistServe's published A100-80GB fits for OPT-13B
(github.com/LLMServe/DistServe, `simdistserve/estimators/profile_data/profiler-a100-80g.distserve.json`,
Apache-2.0; KV capacity from `max_num_tokens.csv` of the same directory), per tensor-parallel degree
1/2/4, in milliseconds:

    prefill batch:  a + b * sum(l) + c * sum(l^2)           l: prompt lengths of the batch
    decode step:    a + b * context + c * batch             context: KV tokens of the batch's requests
                    (one fit below `large_batch_threshold` = 95 requests, another at and above)

Both decode pieces are used here (the planner ships only the small-batch one). `OPT_13B_A100_VLLM` holds
the fits DistServe measured with vLLM as the engine (`profiler-a100-80g.vllm.json`).

One iteration (`Engine.step`) runs one forward pass over a batch that may mix prompt chunks and decodes.
Its time is `max(a_prefill, a_decode)` (one pass: the larger fixed cost, of the kinds present) plus the
prefill fit's token terms over the chunks plus the decode fit's context and batch terms over the
decodes. A chunk of n tokens after k already computed costs `c * n * (2k + n)` in the square term, so a
prompt cut into chunks costs the same attention as in one piece. (No mixed-batch fit is published; this
additive form is the one Sarathi-Serve and Vidur use.)

Scheduling, as vLLM does it:
* Continuous batching under a token budget: each iteration first serves the running requests (one token
  per decode, the next chunk of a partly computed prompt), then admits waiting requests first come,
  first served, while `max_num_batched_tokens` and `max_num_seqs` allow.
* Chunked prefill (colocated and decode default; vLLM's default today): a prompt that does not fit the budget left
  is cut, the rest computed next iterations, decodes ride in the same iterations. Without it
  (`chunked_prefill=False`, and always in the prefill role) an iteration is either whole prompts, FCFS up
  to the budget (a prompt longer than the budget runs alone), or one decode step of the running batch,
  prompts first (vLLM's scheduler before chunked prefill).
* KV cache in blocks of `block_size` tokens, `kv_cache_tokens` in all: a request holds the blocks of
  its computed tokens. A waiting request is admitted only if its blocks fit leaving 1% free (vLLM's
  watermark); a running request that needs a block when none is free preempts the most recently
  admitted running request, whose blocks are freed and which waits again at the head of the queue, to
  recompute its prompt and the tokens generated so far (vLLM's recompute preemption).

Roles:
* "colocated": prefill and decode on the same GPUs.
* "prefill": prompts only. A finished prefill yields its first token and leaves in
  `Iteration.handoffs`: `Handoff(request, ready_at)`, `ready_at` being the iteration's end plus the KV
  transfer (prompt tokens * `kv_bytes_per_token` / `kv_transfer_bytes_per_s`; the default bandwidth
  is 25 GB/s, a 200 Gb/s link). Its blocks are freed at once.
* "decode": takes handed-off requests (`add(request, now)` at or after `ready_at`), whose prompt KV
  arrived with them, and generates the other tokens.

Interface (simulated time: the caller advances its clock to `iteration.end` before the next call; real
time: the caller sleeps `iteration.duration` before delivering the iteration's tokens):

    engine = Engine("colocated", tp=2)                     # profile=OPT_13B_A100, max_num_batched_tokens...
    engine.add(Request("r1", prompt_tokens=300, max_tokens=200), now)
    it = engine.step(now)                                  # None when there is nothing to run
    it.start, it.duration, it.end                          # seconds
    it.produced, it.first_tokens, it.finished, it.handoffs, it.preempted
    engine.metrics.render()                                # Prometheus text, vLLM's metric names

`drive(engine, requests)` runs one engine over timed arrivals in simulated time. Metrics are counted
where a request finishes (success, TTFT, TPOT, lengths, end-to-end latency: a P/D request counts once,
at the decode engine); per-engine figures (tokens, running/waiting, KV usage, preemptions) where they
happen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Literal

Role = Literal["colocated", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("colocated", "prefill", "decode")


@dataclass(frozen=True)
class StepFit:
    """DistServe's per-iteration fits for one tensor-parallel degree (ms; see the module docstring)."""

    tp: int
    prefill: tuple[float, float, float]  # a, b (per token), c (per squared token)
    decode_small: tuple[float, float, float]  # a, b (per context token), c (per request)
    decode_large: tuple[float, float, float]
    large_batch_threshold: int
    kv_cache_tokens: int


@dataclass(frozen=True)
class EngineProfile:
    name: str
    source: str
    kv_bytes_per_token: int  # 2 (K and V) * layers * hidden * 2 bytes (fp16)
    fits: dict[int, StepFit]

    def fit(self, tp: int) -> StepFit:
        if tp not in self.fits:
            raise ValueError(f"tp: profile {self.name!r} has no fit for tp={tp} (has {sorted(self.fits)})")
        return self.fits[tp]


_DISTSERVE = "LLMServe/DistServe simdistserve/estimators/profile_data/"
_OPT_13B_KV_BYTES = 2 * 40 * 5120 * 2

OPT_13B_A100 = EngineProfile(
    name="opt-13b-a100-distserve",
    source=_DISTSERVE + "profiler-a100-80g.distserve.json and max_num_tokens.csv (pp=1)",
    kv_bytes_per_token=_OPT_13B_KV_BYTES,
    fits={
        1: StepFit(1, (16.456860431694288, 0.09264750660897617, 6.474785740229194e-06),
                   (19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
                   (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046), 95, 66144),
        2: StepFit(2, (13.402703359246601, 0.06234291581603636, 2.226884309113053e-06),
                   (13.294796350285385, 0.00034109219700723494, 0.06296393225243659),
                   (10.638741913126715, 0.00031183369638295723, 0.08562913604102729), 95, 163008),
        4: StepFit(4, (10.965724575862776, 0.034619455295915404, 4.7511361198071533e-07),
                   (10.256231678259395, 0.00018786702316166354, 0.03269273629225551),
                   (10.483514938375274, 0.00017120888562939117, 0.04566648525887034), 95, 356736),
    },
)

OPT_13B_A100_VLLM = EngineProfile(
    name="opt-13b-a100-vllm",
    source=_DISTSERVE + "profiler-a100-80g.vllm.json and max_num_tokens.csv (pp=1)",
    kv_bytes_per_token=_OPT_13B_KV_BYTES,
    fits={
        1: StepFit(1, (23.62736227, 0.15054561, 8.65348374e-06),
                   (19.562534173678987, 0.0004941120550644942, 0.05060571771697455),
                   (16.8386301447433, 0.00043897725301957885, 0.14000261546561776), 95, 66144),
        2: StepFit(2, (19.600575891293346, 0.06467523343305222, 6.037181652318591e-06),
                   (20.450486868259052, 0.0001870012118669617, 0.072631560578732484),
                   (14.956474555927338, 0.00038090428876808935, 0.09315896525582677), 95, 163008),
        4: StepFit(4, (21.811658992892433, 0.03679032097721533, 3.0231950949588526e-07),
                   (21.584287035694526, 6.461362045192257e-05, 0.04606739300723169),
                   (19.903237240495486, 0.00023666803411092447, 0.052304365258722736), 95, 356736),
    },
)

PROFILES = {p.name: p for p in (OPT_13B_A100, OPT_13B_A100_VLLM)}


@dataclass(eq=False)
class Request:
    """One request. `max_tokens` counts every output token, the first included. Times are seconds on
    the caller's clock; the engine fills them in."""

    id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float = math.nan
    first_token_at: float = math.nan
    finished_at: float = math.nan
    generated: int = 0
    computed: int = 0  # tokens whose KV this engine holds (or is computing this iteration)
    blocks: int = 0
    preemptions: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens: must be >= 1, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")

    @property
    def tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold before the next token is made."""
        return self.prompt_tokens + self.generated

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (seconds); 0 for one-token outputs."""
        if self.generated <= 1:
            return 0.0
        return (self.finished_at - self.first_token_at) / (self.generated - 1)


@dataclass(frozen=True)
class Handoff:
    request: Request
    ready_at: float  # when its KV cache has reached a decode engine


@dataclass
class Iteration:
    start: float
    duration: float
    prefill_tokens: int = 0
    decode_requests: int = 0
    produced: list[Request] = field(default_factory=list)  # got one token at `end`
    first_tokens: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.duration


# vLLM's bucket edges for these histograms (vllm/engine/metrics.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = next((i for i, edge in enumerate(self.buckets) if value <= edge), len(self.buckets))
        self.counts[index] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for edge, count in zip([*map(_le, self.buckets), "+Inf"], self.counts):
            running += count
            out.append((edge, running))
        return out


def _le(edge: float) -> str:
    return repr(float(edge))


class Metrics:
    """vLLM's Prometheus metrics of one engine, as plain counters and histograms."""

    HISTOGRAMS = {
        "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
        "vllm:time_per_output_token_seconds": TPOT_BUCKETS,  # per request: (finish - first token) / (n - 1)
        "vllm:e2e_request_latency_seconds": LATENCY_BUCKETS,
        "vllm:request_prompt_tokens": TOKEN_BUCKETS,
        "vllm:request_generation_tokens": TOKEN_BUCKETS,
    }

    def __init__(self, model: str) -> None:
        self.model = model
        self.request_success = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.histograms = {name: Histogram(b) for name, b in self.HISTOGRAMS.items()}

    def finish(self, request: Request) -> None:
        self.request_success += 1
        h = self.histograms
        h["vllm:time_to_first_token_seconds"].observe(request.first_token_at - request.arrival)
        if request.generated > 1:
            h["vllm:time_per_output_token_seconds"].observe(request.tpot)
        h["vllm:e2e_request_latency_seconds"].observe(request.finished_at - request.arrival)
        h["vllm:request_prompt_tokens"].observe(request.prompt_tokens)
        h["vllm:request_generation_tokens"].observe(request.generated)

    def render(self) -> str:
        """The Prometheus text exposition format, with vLLM's names and a `model_name` label."""
        label = f'model_name="{self.model}"'
        lines = []
        for name, kind, value, extra in (
            ("vllm:request_success_total", "counter", self.request_success, ',finished_reason="length"'),
            ("vllm:prompt_tokens_total", "counter", self.prompt_tokens, ""),
            ("vllm:generation_tokens_total", "counter", self.generation_tokens, ""),
            ("vllm:num_preemptions_total", "counter", self.preemptions, ""),
            ("vllm:num_requests_running", "gauge", self.running, ""),
            ("vllm:num_requests_waiting", "gauge", self.waiting, ""),
            ("vllm:gpu_cache_usage_perc", "gauge", self.kv_cache_usage, ""),
        ):
            family = name.removesuffix("_total") if kind == "counter" else name
            lines += [f"# TYPE {family} {kind}", f"{name}{{{label}{extra}}} {value}"]
        for name, hist in self.histograms.items():
            lines.append(f"# TYPE {name} histogram")
            lines += [f'{name}_bucket{{{label},le="{le}"}} {count}' for le, count in hist.cumulative()]
            lines += [f"{name}_sum{{{label}}} {hist.sum}", f"{name}_count{{{label}}} {hist.count}"]
        return "\n".join(lines) + "\n"


class Engine:
    """One engine instance (all its GPUs); see the module docstring."""

    def __init__(self, role: Role, tp: int = 1, profile: EngineProfile = OPT_13B_A100, *,
                 max_num_batched_tokens: int = 4096, max_num_seqs: int = 256, block_size: int = 16,
                 chunked_prefill: bool | None = None, kv_cache_tokens: int | None = None,
                 kv_transfer_bytes_per_s: float = 25e9, watermark: float = 0.01) -> None:
        if role not in ROLES:
            raise ValueError(f"role: must be one of {', '.join(ROLES)}, got {role!r}")
        for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                            ("block_size", block_size)):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        if kv_transfer_bytes_per_s <= 0:
            raise ValueError(f"kv_transfer_bytes_per_s: must be > 0, got {kv_transfer_bytes_per_s}")
        self.role, self.tp, self.profile = role, tp, profile
        self.fit = profile.fit(tp)
        self.max_num_batched_tokens, self.max_num_seqs, self.block_size = (
            max_num_batched_tokens, max_num_seqs, block_size)
        self.chunked_prefill = (role != "prefill") if chunked_prefill is None else chunked_prefill
        if role == "prefill" and self.chunked_prefill:
            raise ValueError("chunked_prefill: the prefill role computes whole prompts")
        capacity = self.fit.kv_cache_tokens if kv_cache_tokens is None else kv_cache_tokens
        if capacity < block_size:
            raise ValueError(f"kv_cache_tokens: must hold at least one block of {block_size}, got {capacity}")
        self.total_blocks = capacity // block_size
        self.free_blocks = self.total_blocks
        self.watermark_blocks = int(watermark * self.total_blocks)
        self.kv_transfer_bytes_per_s = kv_transfer_bytes_per_s
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is preempted first
        self.metrics = Metrics(profile.name)
        self._load = 0

    # --- requests in ------------------------------------------------------------------------
    def add(self, request: Request, now: float) -> None:
        if self.role == "decode":
            if request.generated < 1:
                raise ValueError(f"request {request.id}: a decode engine takes prefilled requests "
                                 "(first token made by a prefill engine)")
            request.computed = request.prompt_tokens  # the prompt's KV came with it
        else:
            if request.generated:
                raise ValueError(f"request {request.id}: already has {request.generated} token(s)")
            if math.isnan(request.arrival):  # a router that held the request may have dated it already
                request.arrival = now
            request.computed = 0
        request.blocks = 0
        self.waiting.append(request)
        self._load += request.prompt_tokens + request.max_tokens
        self._gauges()

    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def load(self) -> int:
        """Prompt plus output tokens of the requests this engine holds: what a router balances on."""
        return self._load

    # --- one iteration ----------------------------------------------------------------------
    def step(self, now: float) -> Iteration | None:
        """Schedule and price one iteration starting at `now`; its effects are dated `now + duration`.
        None when there is nothing to run."""
        if self.chunked_prefill:
            batch = self._schedule_mixed()
        else:
            batch = self._schedule_prompts() or self._schedule_decodes()
        if not batch.work:
            self._gauges()
            return None
        decode = [_is_decode(request, tokens) for request, tokens in batch.work]
        iteration = Iteration(now, self._duration_s(batch.work, decode))
        iteration.preempted = batch.preempted
        self._complete(batch.work, decode, iteration)
        self._gauges()
        return iteration

    def _blocks_for(self, request: Request, tokens: int) -> int:
        return max(0, -(-(request.computed + tokens) // self.block_size) - request.blocks)

    def _allocate(self, request: Request, tokens: int, admitting: bool) -> bool:
        need = self._blocks_for(request, tokens)
        reserve = self.watermark_blocks if admitting else 0
        if need > self.free_blocks - reserve:
            return False
        self.free_blocks -= need
        request.blocks += need
        return True

    def _release(self, request: Request) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _preempt_for(self, request: Request, tokens: int, batch: _Batch) -> bool:
        """Free blocks for `tokens` more of `request` by preempting the latest admitted others; False if
        it was itself preempted."""
        while True:
            victim = self.running[-1]
            self.running.pop()
            self._release(victim)
            victim.computed = 0
            victim.preemptions += 1
            self.metrics.preemptions += 1
            self.waiting.appendleft(victim)
            batch.preempted.append(victim)
            batch.work = [(r, n) for r, n in batch.work if r is not victim]
            if victim is request:
                return False
            if self._allocate(request, tokens, admitting=False):
                return True

    def _schedule_mixed(self) -> _Batch:
        batch, budget, block = _Batch(), self.max_num_batched_tokens, self.block_size
        for request in list(self.running):
            if budget == 0:
                break
            if batch.preempted and request in batch.preempted:
                continue  # preempted for an earlier request in this loop
            tokens = min(request.prompt_tokens + request.generated - request.computed, budget)
            need = -(-(request.computed + tokens) // block) - request.blocks  # inlined _allocate: the hot path
            if need > 0:
                if need <= self.free_blocks:
                    self.free_blocks -= need
                    request.blocks += need
                elif not self._preempt_for(request, tokens, batch):
                    continue
            batch.work.append((request, tokens))
            budget -= tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not batch.preempted:
            request = self.waiting[0]
            tokens = min(request.tokens - request.computed, budget)
            if not self._allocate(request, tokens, admitting=True):
                break
            self.waiting.popleft()
            self.running.append(request)
            batch.work.append((request, tokens))
            budget -= tokens
        return batch

    def _schedule_prompts(self) -> _Batch:
        batch, budget = _Batch(), self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            tokens = request.tokens - request.computed
            if batch.work and tokens > budget:
                break
            if not self._allocate(request, tokens, admitting=True):
                break
            self.waiting.popleft()
            self.running.append(request)
            batch.work.append((request, tokens))
            budget -= tokens
        return batch

    def _schedule_decodes(self) -> _Batch:
        batch = _Batch()
        for request in list(self.running):
            if batch.preempted and request in batch.preempted:
                continue
            if not self._allocate(request, 1, admitting=False) and not self._preempt_for(request, 1, batch):
                continue
            batch.work.append((request, 1))
        return batch

    def _duration_s(self, work: list[tuple[Request, int]], decode: list[bool]) -> float:
        fit = self.fit
        prefill_tokens = squares = decodes = context = 0
        for (request, tokens), is_decode in zip(work, decode):
            if is_decode:
                decodes += 1
                context += request.computed + 1
            else:
                prefill_tokens += tokens
                squares += tokens * (2 * request.computed + tokens)
        fixed = ms = 0.0
        if prefill_tokens:
            a, b, c = fit.prefill
            fixed = a
            ms += b * prefill_tokens + c * squares
        if decodes:
            a, b, c = fit.decode_small if decodes < fit.large_batch_threshold else fit.decode_large
            fixed = max(fixed, a)
            ms += b * context + c * decodes
        return (fixed + ms) / 1000.0

    def _complete(self, work: list[tuple[Request, int]], decode: list[bool], iteration: Iteration) -> None:
        end = iteration.end
        metrics = self.metrics
        produced = iteration.produced
        for (request, tokens), is_decode in zip(work, decode):
            if is_decode:
                iteration.decode_requests += 1
            else:
                iteration.prefill_tokens += tokens
                if request.generated == 0:
                    metrics.prompt_tokens += tokens
            request.computed += tokens
            if request.computed < request.prompt_tokens + request.generated:
                continue  # a chunk of a prompt: no token yet
            request.generated += 1
            produced.append(request)
            if request.generated == 1:
                request.first_token_at = end
                iteration.first_tokens.append(request)
            if request.generated >= request.max_tokens:
                request.finished_at = end
                self._leave(request)
                iteration.finished.append(request)
                metrics.finish(request)
            elif self.role == "prefill":
                self._leave(request)
                transfer = request.prompt_tokens * self.profile.kv_bytes_per_token / self.kv_transfer_bytes_per_s
                iteration.handoffs.append(Handoff(request, end + transfer))
        metrics.generation_tokens += len(produced)

    def _leave(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        self._load -= request.prompt_tokens + request.max_tokens

    def _gauges(self) -> None:
        self.metrics.running = len(self.running)
        self.metrics.waiting = len(self.waiting)
        self.metrics.kv_cache_usage = 1.0 - self.free_blocks / self.total_blocks


def _is_decode(request: Request, tokens: int) -> bool:
    """One token after the prompt's KV: a decode (a recomputed prompt after preemption is prefill)."""
    return tokens == 1 and request.generated > 0 and request.computed >= request.prompt_tokens


@dataclass
class _Batch:
    work: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens computed this iteration)
    preempted: list[Request] = field(default_factory=list)


def drive(engine: Engine, arrivals: Iterable[tuple[float, Request]]) -> list[Iteration]:
    """Run one engine in simulated time over (arrival time, request) pairs until it is idle; returns its
    iterations. A decode engine takes each request at its time as if handed off then."""
    pending = deque(sorted(arrivals, key=lambda pair: pair[0]))
    iterations: list[Iteration] = []
    now = 0.0
    while pending or not engine.idle():
        while pending and pending[0][0] <= now:
            arrival, request = pending.popleft()
            engine.add(request, arrival)
        iteration = engine.step(now)
        if iteration is None:
            if not pending:
                if not engine.idle():
                    raise RuntimeError("engine: requests wait but none can run (a request larger than "
                                       "the KV cache?)")
                break
            now = pending[0][0]
            continue
        iterations.append(iteration)
        now = iteration.end
    return iterations
