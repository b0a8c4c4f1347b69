"""rlvr: reinforcement learning with verifiable rewards for LLMs, in JAX."""

__version__ = "0.1.0"
