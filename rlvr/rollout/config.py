"""The RL step's settings (`RLConfig`, config section `rl.loop`): batch and group sizes,
sampling, dynamic sampling and staleness. How a buffer becomes optimizer steps (advantages,
mini-batches, epochs, old log-probs, packing) is the learner's (`rl.learner`)."""

from __future__ import annotations

import dataclasses

from rlvr.common import settings
from rlvr.learner.packing import BatchShape
from rlvr.sampling.types import SamplingParams


@dataclasses.dataclass(frozen=True)
class RLConfig:
  prompts_per_step: int = 32  # groups in one update
  group_size: int = 8  # G responses per prompt
  max_prompt_len: int = 128
  max_response_len: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  repetition_penalty: float = 1.0  # vLLM / HF semantics; 1 = off
  dynamic_sampling: bool = True  # keep only groups with 0 < acc < 1
  max_extra_rounds: int = 3  # bounded over-sampling rounds per step
  oversample: float = 2.0  # extra prompts per missing group in later rounds
  max_staleness: int = 0  # 0: each step samples from the weights it updates; 1: the
  # buffer of step t+1 is sampled from the weights before update t, while it runs
  seed: int = settings.derived(0, "seed")  # the run's seed, filled at launch

  def __post_init__(self):
    for name in (
      "prompts_per_step",
      "group_size",
      "max_prompt_len",
      "max_response_len",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if self.group_size < 2:
      raise ValueError(f"group_size: GRPO needs >= 2 responses per prompt, got {self.group_size}")
    if self.max_extra_rounds < 0 or self.oversample < 1:
      raise ValueError("max_extra_rounds must be >= 0 and oversample >= 1")
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")
    if self.max_staleness not in (0, 1):
      raise ValueError(
        f"max_staleness: expected 0 or 1, got {self.max_staleness} (one set of sampler "
        "weights holds one version; staleness 2 would need two)"
      )

  @property
  def rows(self) -> int:
    return self.prompts_per_step * self.group_size

  @property
  def batch_shape(self) -> BatchShape:
    """The shapes a buffer's update batches start from (`learner.packing.build_batch`)."""
    return BatchShape(self.rows, self.group_size, self.seq_len)

  @property
  def seq_len(self) -> int:
    total = self.max_prompt_len + self.max_response_len
    return -(-total // 16) * 16

  def sampling_params(self, seed: int) -> SamplingParams:
    return SamplingParams(
      n=self.group_size,
      temperature=self.temperature,
      top_p=self.top_p,
      top_k=self.top_k,
      repetition_penalty=self.repetition_penalty,
      max_tokens=self.max_response_len,
      seed=seed,
    )
