"""What rollouts are made of: a `Prompt` (token ids and the answer it is scored against), a
`Group` (one prompt's responses, scored), what a buffer's build cost and met
(`RolloutStats`) and the sampling seed of a generation round (`step_seed`)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from rlvr.sampling.types import Completion


@dataclasses.dataclass(frozen=True)
class Prompt:
  """A problem as the policy sees it: prompt token ids plus the answer it is scored against.

  Methods draw these from the training set and create new ones (synthetic,
  composed, variants); `source` says where one came from, `text` is the
  problem statement (without chat template) for methods that rewrite it.
  """

  ids: tuple[int, ...]
  answer: str
  text: str = ""
  source: str = ""


@dataclasses.dataclass
class Group:
  """One prompt's G responses, scored."""

  prompt: Prompt
  completions: list[Completion]
  rewards: np.ndarray  # [G] float
  correct: np.ndarray  # [G] bool
  tags: dict[str, str] = dataclasses.field(default_factory=dict)  # a method's labels of the
  # group (SvS: data_type), written with its responses to the samples log (`samples_log`)

  @property
  def mixed(self) -> bool:
    """Some but not all responses correct (DAPO's dynamic-sampling filter: by accuracy, so
    shaping terms such as the overlong penalty do not make a solved group 'mixed')."""
    return bool(self.correct.any() and not self.correct.all())


# (texts, golds, prompts=None) -> (rewards, correct): prompts, the problem statement of each text
ScoreFn = Callable[..., tuple[np.ndarray, np.ndarray]]


def step_seed(seed: int, step: int, round_: int) -> int:
  """Sampling seed of one generation round, stable across restarts."""
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2**31)


@dataclasses.dataclass
class RolloutStats:
  """What one buffer's build cost and met, counted as its calls go through a `Rollout`.

  time_sample / time_score: seconds in the sampler's generate and in the scorer;
  generated_tokens: tokens the generate calls produced (a timing: a resumed method may reuse
  stored work); prompts_too_long: prompts dropped for rl.max_prompt_len; shaping_sums /
  shaped: the shaping terms summed over the shaped responses; verdicts: responses per
  verifier verdict; reward_values: a verifier's named values, per response; reported: the
  groups the step's rollout metrics describe (`Rollout.report_rollouts`).
  """

  time_sample: float = 0.0
  time_score: float = 0.0
  generated_tokens: int = 0
  prompts_too_long: int = 0
  shaping_sums: dict[str, float] = dataclasses.field(default_factory=dict)
  shaped: int = 0
  verdicts: dict[str, int] = dataclasses.field(default_factory=dict)
  reward_values: dict[str, list] = dataclasses.field(default_factory=dict)
  reported: tuple[list[Group], list[Group], int] | None = None

  @property
  def sampled(self) -> list[Group]:
    """The groups sampled for the update, as reported (none when nothing was)."""
    return list(self.reported[0]) if self.reported is not None else []

  def metrics(self) -> dict[str, float]:
    """The counters as metrics (the rollout metrics of the reported groups aside)."""
    return {
      "prompts_too_long": self.prompts_too_long,
      **{k: v / max(self.shaped, 1) for k, v in self.shaping_sums.items()},
      **{f"verdict_{k}": v for k, v in self.verdicts.items()},
      **{k: sum(v) / max(len(v), 1) for k, v in self.reward_values.items()},
      "time_sample": self.time_sample,
      "time_score": self.time_score,
    }
