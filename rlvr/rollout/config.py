"""The RL step's settings (`RLConfig`, config section `rl.loop`): batch and group sizes,
sampling, dynamic sampling, the advantage estimator, PPO mini-batches, packing and staleness."""

from __future__ import annotations

import dataclasses

from rlvr import objectives
from rlvr.common import settings
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
  advantage: str = "grpo"  # "grpo" | "dr_grpo" | "rloo" | "reinforce++" |
  # "reinforce++_baseline" (objectives.ADVANTAGES), or "package.module:function"
  normalize_std: bool = True  # False with advantage "grpo": the "dr_grpo" estimator
  adv_std_ddof: int = 1  # std as verl / TRL take it (torch.std, unbiased); 0: population
  ppo_mini_batch_size: int = 0  # groups (prompts) per optimizer step, as verl's
  # ppo_mini_batch_size; 0: the whole buffer in one step
  ppo_epochs: int = 1  # passes over a buffer's mini-batches
  old_logp: str = "learner"  # old policy of a multi-step update: "learner" (recomputed
  # once per rollout batch, as verl) or "sampler" (its logprobs)
  pack: bool = False  # the update packs several sequences per row (verl's
  # remove-padding, TRL's padding-free)
  pack_len: int = 0  # packed row length (0: seq_len, the longest sequence)
  pack_min_rows: int = 8  # packed row counts: powers of two >= this (a multiple of
  # data-parallel devices x learner micro-batch rows)
  max_staleness: int = 0  # 0: each step samples from the weights it updates; 1: the
  # buffer of step t+1 is sampled from the weights before update t, while it runs
  seed: int = settings.derived(0, "seed")  # the run's seed, filled at launch

  def __post_init__(self):
    for name in (
      "prompts_per_step",
      "group_size",
      "max_prompt_len",
      "max_response_len",
      "ppo_epochs",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if self.group_size < 2:
      raise ValueError(f"group_size: GRPO needs >= 2 responses per prompt, got {self.group_size}")
    if self.max_extra_rounds < 0 or self.oversample < 1:
      raise ValueError("max_extra_rounds must be >= 0 and oversample >= 1")
    if not self.normalize_std and self.advantage not in ("grpo", "dr_grpo"):
      raise ValueError(
        f"normalize_std: False is the 'dr_grpo' estimator; advantage={self.advantage!r} "
        "takes normalize_std=True"
      )
    objectives.advantage_fn(self.advantage)  # a one-line error naming the known estimators
    if self.adv_std_ddof not in (0, 1):
      raise ValueError(f"adv_std_ddof: expected 0 or 1, got {self.adv_std_ddof}")
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")
    if self.ppo_mini_batch_size < 0:
      raise ValueError(
        f"ppo_mini_batch_size: must be >= 0 (0 = whole buffer), got {self.ppo_mini_batch_size}"
      )
    if self.old_logp not in ("learner", "sampler"):
      raise ValueError(f"old_logp: unknown {self.old_logp!r}; expected learner|sampler")
    if self.max_staleness not in (0, 1):
      raise ValueError(
        f"max_staleness: expected 0 or 1, got {self.max_staleness} (one set of sampler "
        "weights holds one version; staleness 2 would need two)"
      )
    if self.max_staleness and self.old_logp != "learner":
      raise ValueError(
        "old_logp: 'sampler' with max_staleness=1 would clip against weights one update "
        "behind the learner's; use old_logp='learner' (TIS still uses the sampler's)"
      )
    if self.pack_len < 0 or self.pack_min_rows < 1:
      raise ValueError(
        f"pack_len / pack_min_rows: must be >= 0 / >= 1, got {self.pack_len} / {self.pack_min_rows}"
      )

  @property
  def advantage_estimator(self) -> str:
    """The `objectives.ADVANTAGES` name in effect: `advantage`, or "dr_grpo" for "grpo" with
    normalize_std False."""
    return "dr_grpo" if self.advantage == "grpo" and not self.normalize_std else self.advantage

  @property
  def rows(self) -> int:
    return self.prompts_per_step * self.group_size

  @property
  def mini_batch_rows(self) -> int:
    """Rows of one mini-batch of full groups (the smallest shape a mini-batch is padded to)."""
    return self.ppo_mini_batch_size * self.group_size if self.ppo_mini_batch_size else self.rows

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
