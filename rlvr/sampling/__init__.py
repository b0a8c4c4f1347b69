"""Samplers: the Sampler protocol, an in-process JAX sampler and a vLLM client."""

from rlvr.sampling.jax_sampler import JaxSampler
from rlvr.sampling.types import Completion, Sampler, SamplingParams

__all__ = ["Completion", "JaxSampler", "Sampler", "SamplingParams"]
