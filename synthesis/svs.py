"""SvS (self-play variational problem synthesis): the pure parts of one step.

No jax, no network: the training loop passes sampled texts and scores in and
gets prompts, problems and rewards out (it builds the buffer's groups). Rules and
numbers: docs/methods.md#svs.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from typing import Sequence

_PROMPT_PATH = os.path.join(os.path.dirname(__file__), "prompts", "svs_synthesis.txt")
# Code (SvS Section 5.4): reconstruct the programming problem, with its input and output
# formats and constraints, that a correct program answers; our wording.
_CODE_PROMPT_PATH = os.path.join(os.path.dirname(__file__), "prompts", "svs_synthesis_code.txt")
MAX_PROBLEM_CHARS = 4000


def underperforming(acc: float, lo: float = 0.125, hi: float = 0.5) -> bool:
  """Problems worth augmenting: lo <= acc <= hi (1..4 of 8 correct by default)."""
  return lo <= acc <= hi


def build_synthesis_prompt(solution_text: str, template: str | None = None) -> str:
  """The synthesis task for one correct response (shown in <response> tags)."""
  if template is None:
    with open(_PROMPT_PATH) as f:
      template = f.read()
  return template.replace("{solution}", solution_text.strip())


def code_template() -> str:
  """The synthesis prompt for code (`{solution}` is the correct response, program included)."""
  with open(_CODE_PROMPT_PATH) as f:
    return f.read()


_TEXT_FENCE = re.compile(r"```text[ \t]*\n(.*?)```", re.DOTALL)
_ANY_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_problem(text: str, max_chars: int = MAX_PROBLEM_CHARS) -> str | None:
  """The synthesized problem: after the last </think>, the ```text fence, else the first
  fence of any kind; None when there is none, it is empty, or it exceeds max_chars."""
  if "</think>" in text:
    text = text.rsplit("</think>", 1)[1]
  m = _TEXT_FENCE.search(text) or _ANY_FENCE.search(text)
  if m is None:
    return None
  problem = m.group(1).strip()
  if not problem or len(problem) > max_chars:
    return None
  return problem


def synthesis_reward(
  acc: float, lo: float = 0.125, hi: float = 0.625, naive: bool = False
) -> float:
  """R_V of a synthetic problem from its solve accuracy: 1 if lo <= acc <= hi (1..5 of 8)
  else 0; the naive ablation rewards any acc > 0 (exploitable by answer hints)."""
  if naive:
    return float(acc > 0)
  return float(lo <= acc <= hi)


@dataclasses.dataclass(frozen=True)
class SvSConfig:
  under_lo: float = 0.125  # underperforming band (SvS-Asp: 0.375 .. 0.75)
  under_hi: float = 0.5
  reward_lo: float = 0.125  # synthesis reward band
  reward_hi: float = 0.625
  naive_reward: bool = False
  syntheses_per_solution: int = 8  # G_v
  type2_keep_ratio: float = 1.0  # fraction of mixed synthesis groups kept (paper ablates 0.2)
  max_problem_chars: int = MAX_PROBLEM_CHARS
  mode: str = "svs"  # "svs" or "eup" (second rollout instead of synthesis)
  refill_originals: bool = True  # False: the authors' loop, prompts_per_step originals sampled
  # once, the mixed ones kept; True: dynamic-sampling refill
  template: str = "default"  # synthesis prompt: "default" (our wording), "code" (a
  # programming problem from a correct program), "arithmetic" (the procedural task's) or a
  # file path

  def __post_init__(self):
    if not 0 <= self.under_lo <= self.under_hi <= 1:
      raise ValueError(f"under_lo/under_hi: bad band {self.under_lo}..{self.under_hi}")
    if not 0 <= self.reward_lo <= self.reward_hi <= 1:
      raise ValueError(f"reward_lo/reward_hi: bad band {self.reward_lo}..{self.reward_hi}")
    if not 0 <= self.type2_keep_ratio <= 1:
      raise ValueError(f"type2_keep_ratio: must be in [0, 1], got {self.type2_keep_ratio}")
    if self.syntheses_per_solution < 2:
      raise ValueError("syntheses_per_solution: GRPO needs >= 2")
    if self.mode not in ("svs", "eup"):
      raise ValueError(f"mode: unknown {self.mode!r}; expected svs|eup")


def _mixed(rewards: Sequence[float]) -> bool:
  return len(set(rewards)) > 1


def synthesis_rewards(
  synthetic_accs: Sequence[float | None], cfg: SvSConfig, rng: random.Random
) -> tuple[float, ...] | None:
  """Type 2: the R_V rewards of the G_v syntheses of one correct response, or None
  when that synthesis group is not kept.

  synthetic_accs[k] is the solve accuracy of synthesis k's problem, or None when
  no problem could be extracted (reward 0). Kept only when rewards are mixed,
  then with probability type2_keep_ratio.
  """
  rewards = [
    0.0 if a is None else synthesis_reward(a, cfg.reward_lo, cfg.reward_hi, cfg.naive_reward)
    for a in synthetic_accs
  ]
  if not _mixed(rewards) or rng.random() >= cfg.type2_keep_ratio:
    return None
  return tuple(rewards)


def rejection_reason(acc: float | None, cfg: SvSConfig) -> str:
  """Why a synthetic problem earns R_V = 0 (for metrics): unparseable, too_easy, too_hard."""
  if acc is None:
    return "unparseable"
  if synthesis_reward(acc, cfg.reward_lo, cfg.reward_hi, cfg.naive_reward):
    return "accepted"
  return "too_hard" if acc < cfg.reward_lo else "too_easy"
