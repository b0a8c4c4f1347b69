"""Samplers: the Sampler protocol, an in-process JAX sampler and a vLLM client."""
