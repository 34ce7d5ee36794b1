"""The engine double's scheduling: batching, chunking, KV capacity and preemption, P/D handoff, metrics."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flotilla.testing.engine import OPT_13B_A100, Engine, Request, drive

FIT1 = OPT_13B_A100.fit(1)


def prefill_ms(lengths, fit=FIT1):
    a, b, c = fit.prefill
    return a + b * sum(lengths) + c * sum(n * n for n in lengths)


def decode_ms(batch, context, fit=FIT1):
    a, b, c = fit.decode_small if batch < fit.large_batch_threshold else fit.decode_large
    return a + b * context + c * batch


def test_one_request_prefill_then_decode_steps_priced_by_the_profile():
    engine = Engine("colocated", tp=1)
    request = Request("r", prompt_tokens=100, max_tokens=3)
    iterations = drive(engine, [(0.0, request)])
    assert len(iterations) == 3
    assert iterations[0].duration == pytest.approx(prefill_ms([100]) / 1000)
    assert iterations[0].first_tokens == [request]
    # the second token attends over the prompt and the first token
    assert iterations[1].duration == pytest.approx(decode_ms(1, 101) / 1000)
    assert iterations[2].duration == pytest.approx(decode_ms(1, 102) / 1000)
    assert iterations[2].finished == [request]
    assert request.generated == 3
    assert request.first_token_at == pytest.approx(iterations[0].end)
    assert request.tpot == pytest.approx((iterations[2].end - iterations[0].end) / 2)
    assert engine.idle() and engine.free_blocks == engine.total_blocks


def test_continuous_batching_admits_arrivals_into_the_running_batch():
    engine = Engine("colocated", tp=1)
    first = Request("a", prompt_tokens=50, max_tokens=20)
    late = Request("b", prompt_tokens=50, max_tokens=5)
    iterations = drive(engine, [(0.0, first), (0.05, late)])
    joined = next(it for it in iterations if late in it.first_tokens)
    # the late prompt is computed in the same iteration as a decode of the first request
    assert joined.decode_requests == 1 and joined.prefill_tokens == 50
    assert late.finished_at < first.finished_at


def test_prompts_are_batched_up_to_the_token_budget_without_chunking():
    engine = Engine("prefill", tp=1, max_num_batched_tokens=1000)
    requests = [Request(str(i), prompt_tokens=400, max_tokens=10) for i in range(3)]
    for r in requests:
        engine.add(r, 0.0)
    it = engine.step(0.0)
    assert [h.request for h in it.handoffs] == requests[:2]  # 800 tokens; the third would exceed 1000
    assert it.duration == pytest.approx(prefill_ms([400, 400]) / 1000)
    assert engine.step(it.end).handoffs[0].request is requests[2]


def test_a_prompt_longer_than_the_budget_runs_alone_when_not_chunked():
    engine = Engine("prefill", tp=1, max_num_batched_tokens=512)
    engine.add(Request("long", prompt_tokens=1500, max_tokens=2), 0.0)
    it = engine.step(0.0)
    assert it.prefill_tokens == 1500 and len(it.handoffs) == 1


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_running():
    engine = Engine("colocated", tp=1, max_num_batched_tokens=512)
    decoding = Request("d", prompt_tokens=20, max_tokens=50)
    engine.add(decoding, 0.0)
    now = engine.step(0.0).end  # its prefill
    long = Request("long", prompt_tokens=1200, max_tokens=2)
    engine.add(long, now)
    chunks = []
    while long.first_token_at != long.first_token_at:  # NaN until the prompt is done
        it = engine.step(now)
        chunks.append(it.prefill_tokens)
        assert it.decode_requests == 1  # the decode batch is not stalled by the long prompt
        now = it.end
    assert chunks == [511, 511, 178]
    # chunked attention costs the same as the prompt in one piece
    a, b, c = FIT1.prefill
    assert c * sum(n * (2 * k + n) for n, k in ((511, 0), (511, 511), (178, 1022))) == pytest.approx(c * 1200**2)


def test_without_chunked_prefill_a_prompt_stalls_the_decode_batch():
    engine = Engine("colocated", tp=1, max_num_batched_tokens=4096, chunked_prefill=False)
    decoding = Request("d", prompt_tokens=20, max_tokens=50)
    engine.add(decoding, 0.0)
    now = engine.step(0.0).end
    engine.add(Request("p", prompt_tokens=1200, max_tokens=2), now)
    it = engine.step(now)
    assert it.prefill_tokens == 1200 and it.decode_requests == 0


def test_kv_capacity_makes_arrivals_wait():
    # 40 blocks of 16 tokens; each request needs 10 blocks for its prompt and grows by one block
    engine = Engine("colocated", tp=1, kv_cache_tokens=640, watermark=0.0)
    requests = [Request(str(i), prompt_tokens=160, max_tokens=8) for i in range(6)]
    for r in requests:
        engine.add(r, 0.0)
    engine.step(0.0)
    assert len(engine.running) == 4 and len(engine.waiting) == 2
    drive(engine, [])
    assert all(r.generated == 8 for r in requests)
    assert engine.free_blocks == engine.total_blocks


def test_kv_exhaustion_preempts_the_latest_admitted_and_recomputes_it():
    # 2 requests of 16-token prompts fill 4 blocks once they grow past 32 tokens each
    engine = Engine("colocated", tp=1, kv_cache_tokens=64, watermark=0.0)
    old, new = Request("old", prompt_tokens=16, max_tokens=30), Request("new", prompt_tokens=16, max_tokens=30)
    iterations = drive(engine, [(0.0, old), (0.0, new)])
    preempted = [r for it in iterations for r in it.preempted]
    assert preempted and set(preempted) == {new}
    assert old.generated == new.generated == 30
    assert old.finished_at < new.finished_at
    # the victim recomputed its prompt and the tokens it had generated
    recompute = next(it for it in iterations if it.prefill_tokens > 16)
    assert recompute.prefill_tokens > new.prompt_tokens
    assert engine.metrics.preemptions == len(preempted)


def test_prefill_hands_off_to_decode_after_the_kv_transfer():
    prefill = Engine("prefill", tp=2)
    decode = Engine("decode", tp=1)
    request = Request("r", prompt_tokens=512, max_tokens=4)
    prefill.add(request, 0.0)
    it = prefill.step(0.0)
    assert it.first_tokens == [request] and request.generated == 1
    [handoff] = it.handoffs
    transfer = 512 * OPT_13B_A100.kv_bytes_per_token / 25e9
    assert handoff.ready_at == pytest.approx(it.end + transfer)
    assert prefill.idle() and prefill.free_blocks == prefill.total_blocks
    # the decode engine computes no prompt: three decode steps make tokens 2..4
    iterations = drive(decode, [(handoff.ready_at, request)])
    assert [i.decode_requests for i in iterations] == [1, 1, 1] and all(i.prefill_tokens == 0 for i in iterations)
    assert request.generated == 4 and request.finished_at == pytest.approx(iterations[-1].end)
    assert request.first_token_at == pytest.approx(it.end)
    # the request is counted once, where it finished
    assert prefill.metrics.request_success == 0 and decode.metrics.request_success == 1


def test_decode_engine_rejects_a_request_that_was_not_prefilled():
    with pytest.raises(ValueError, match="prefilled"):
        Engine("decode").add(Request("r", 10, 5), 0.0)


def test_tensor_parallel_degree_selects_the_fit():
    times = {}
    for tp in (1, 2, 4):
        engine = Engine("prefill", tp=tp)
        engine.add(Request("r", prompt_tokens=1000, max_tokens=2), 0.0)
        times[tp] = engine.step(0.0).duration
    assert times[1] > times[2] > times[4]
    with pytest.raises(ValueError, match="tp"):
        Engine("colocated", tp=3)


def test_large_batches_use_the_large_batch_fit():
    engine = Engine("decode", tp=1)
    for i in range(100):
        r = Request(str(i), prompt_tokens=10, max_tokens=3)
        r.generated, r.first_token_at, r.arrival = 1, 0.0, 0.0
        engine.add(r, 0.0)
    it = engine.step(0.0)
    assert it.decode_requests == 100
    assert it.duration == pytest.approx(decode_ms(100, 100 * 11) / 1000)


@pytest.mark.parametrize("field,kwargs", [("role", {"role": "router"}),
                                          ("max_num_batched_tokens", {"role": "colocated", "max_num_batched_tokens": 0}),
                                          ("chunked_prefill", {"role": "prefill", "chunked_prefill": True}),
                                          ("kv_cache_tokens", {"role": "colocated", "kv_cache_tokens": 4})])
def test_bad_settings_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        Engine(**kwargs)


def test_metrics_render_vllm_names_readable_by_a_prometheus_parser():
    engine = Engine("colocated", tp=1)
    requests = [Request(str(i), prompt_tokens=100 + i, max_tokens=10) for i in range(5)]
    drive(engine, [(0.01 * i, r) for i, r in enumerate(requests)])
    samples = {s.name + str(sorted(s.labels.items())): s.value
               for f in text_string_to_metric_families(engine.metrics.render()) for s in f.samples}
    names = {key.split("[")[0] for key in samples}
    assert {"vllm:request_success_total", "vllm:time_to_first_token_seconds_count",
            "vllm:time_per_output_token_seconds_sum", "vllm:request_prompt_tokens_bucket",
            "vllm:request_generation_tokens_count", "vllm:num_requests_running", "vllm:gpu_cache_usage_perc",
            "vllm:num_preemptions_total"} <= names
    success = [v for k, v in samples.items() if k.startswith("vllm:request_success_total")]
    assert success == [5.0]
    ttft_sum = [v for k, v in samples.items() if k.startswith("vllm:time_to_first_token_seconds_sum")][0]
    assert ttft_sum == pytest.approx(sum(r.first_token_at - r.arrival for r in requests))
    assert engine.metrics.prompt_tokens == sum(r.prompt_tokens for r in requests)
    assert engine.metrics.generation_tokens == 50


def test_the_controller_reads_a_window_from_two_scrapes():
    from flotilla.controller import vllm

    engine = Engine("colocated", tp=2)
    before = vllm.parse(engine.metrics.render(), 0.0)
    drive(engine, [(0.1 * i, Request(str(i), prompt_tokens=200, max_tokens=40)) for i in range(50)])
    window = vllm.window(before, vllm.parse(engine.metrics.render(), 10.0))
    assert window.requests == 50 and window.requests_per_second == pytest.approx(5.0)
    assert 100 <= window.mean_prompt_tokens <= 200  # bucketed sum is exact: 200
    assert window.ttft_p90_ms is not None and window.tpot_p90_ms is not None
