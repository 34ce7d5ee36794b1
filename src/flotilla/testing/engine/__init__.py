"""An LLM engine double for tests and benchmarks (stands in for vLLM); see `core`."""

from flotilla.testing.engine.core import (OPT_13B_A100, OPT_13B_A100_VLLM, PROFILES, Engine, EngineProfile, Handoff,
                                          Iteration, Metrics, Request, StepFit, drive)

__all__ = ["OPT_13B_A100", "OPT_13B_A100_VLLM", "PROFILES", "Engine", "EngineProfile", "Handoff", "Iteration",
           "Metrics", "Request", "StepFit", "drive"]
