"""Latency profiles shipped with Flotilla, selectable by `spec.profile.name`.

Provenance: the coefficients are the fits published in DistServe's simulator
(github.com/LLMServe/DistServe, `simdistserve/estimators/profile_data/profiler-a100-80g.distserve.json`
and `max_num_tokens.csv`, Apache-2.0), measured by its authors with the DistServe engine on A100-80GB
GPUs. We use their prefill fit as first published (same functional form): their commit 4c68ed9
("Realign the curve", May 2024) multiplied it by 1.1, the overhead factor their estimator had applied.
Their decode fit is piecewise in the
batch size (split at 95 requests); we ship the small-batch piece, which is the regime an SLO-bound
decode instance runs in, and note that it over-estimates step time by a few percent at batches of 95
and above. `kvCacheTokens` is their `max_num_tokens` for pipeline degree 1. `maxBatchTokens` and
`maxBatchSize` are our choices (engine settings), not measurements. OPT-13B and OPT-66B have a 2048-token
context; traces with longer prompts are outside what these fits cover.
"""

from __future__ import annotations

from flotilla.serving.profile import DecodeFit, PrefillFit, Profile

_SOURCE = ("DistServe simulator A100-80GB fits (LLMServe/DistServe simdistserve/estimators/profile_data/"
           "profiler-a100-80g.distserve.json before commit 4c68ed9's 1.1 prefill factor, small-batch decode piece; "
           "KV capacity from max_num_tokens.csv)")

OPT_13B_A100 = Profile(
    name="opt-13b-a100",
    provenance=_SOURCE,
    # bench/serving_model.py against the engine double, chat lengths, the worse of TTFT 400 / TPOT 60 ms
    # and TTFT 200 / TPOT 100 ms at 0.9 (docs/serving.md has the table)
    prediction_errors=(("prefill", 1, 0.085), ("prefill", 2, 0.096), ("prefill", 4, 0.133),
                       ("decode", 1, -0.027), ("decode", 2, -0.088), ("decode", 4, -0.058),
                       ("colocated", 1, -0.027), ("colocated", 2, -0.037), ("colocated", 4, 0.016)),
    prefill=(
        PrefillFit(gpus=1, constant_ms=16.456860431694288, per_token_ms=0.09264750660897617,
                   per_token_squared_ms=6.474785740229194e-06),
        PrefillFit(gpus=2, constant_ms=13.402703359246601, per_token_ms=0.06234291581603636,
                   per_token_squared_ms=2.226884309113053e-06),
        PrefillFit(gpus=4, constant_ms=10.965724575862776, per_token_ms=0.034619455295915404,
                   per_token_squared_ms=4.7511361198071533e-07),
    ),
    decode=(
        DecodeFit(gpus=1, constant_ms=19.934702624895458, per_request_ms=0.03850697740828398,
                  per_context_token_ms=0.0006269356524350583, kv_cache_tokens=66144),
        DecodeFit(gpus=2, constant_ms=13.294796350285385, per_request_ms=0.06296393225243659,
                  per_context_token_ms=0.00034109219700723494, kv_cache_tokens=163008),
        DecodeFit(gpus=4, constant_ms=10.256231678259395, per_request_ms=0.03269273629225551,
                  per_context_token_ms=0.00018786702316166354, kv_cache_tokens=356736),
    ),
)

OPT_66B_A100 = Profile(
    name="opt-66b-a100",
    provenance=_SOURCE,
    prefill=(
        PrefillFit(gpus=2, constant_ms=39.14437589353578, per_token_ms=0.24929935185985747,
                   per_token_squared_ms=2.0434584061063132e-05),
        PrefillFit(gpus=3, constant_ms=29.998390934942755, per_token_ms=0.1778932442244592,
                   per_token_squared_ms=1.109568089177615e-05),
        PrefillFit(gpus=4, constant_ms=26.76512367065223, per_token_ms=0.1375928914774527,
                   per_token_squared_ms=7.561318878163137e-06),
    ),
    decode=(
        DecodeFit(gpus=2, constant_ms=48.288015489286245, per_request_ms=0.12755020094383188,
                  per_context_token_ms=0.0009424343535737985, kv_cache_tokens=11600),
        DecodeFit(gpus=3, constant_ms=35.8015439512012, per_request_ms=0.0952669764890301,
                  per_context_token_ms=0.0005845004786127403, kv_cache_tokens=45056),
        DecodeFit(gpus=4, constant_ms=30.760284619429587, per_request_ms=0.063284195750671,
                  per_context_token_ms=0.000451947603788462, kv_cache_tokens=78496),
    ),
)

SHIPPED_PROFILES: dict[str, Profile] = {p.name: p for p in (OPT_13B_A100, OPT_66B_A100)}
