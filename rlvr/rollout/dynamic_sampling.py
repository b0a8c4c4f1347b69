"""Dynamic sampling (DAPO): rounds of rollouts until a step has `prompts_per_step` groups
with mixed rewards (`gather_groups`), the error when none had any (`NoSignalError`,
`no_signal_fix`), and the metrics of a step's rollouts (`rollout_metrics`)."""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from rlvr.envs.episode_metrics import episode_metrics
from rlvr.rollout import stats
from rlvr.rollout.config import RLConfig
from rlvr.rollout.context import Rollout, step_seed
from rlvr.rollout.types import Group, Prompt


class Draws(Protocol):
  """Where a step's prompts come from (`methods.PromptPool`)."""

  def draw(self, k: int) -> list[Prompt]: ...


class NoSignalError(RuntimeError):
  """Every sampled group had zero reward variance for all allowed rounds."""


def no_signal_fix(solve_all: float, solve_none: float) -> str:
  """What to change when no group has mixed rewards, from the fractions of groups all right
  and all wrong."""
  if solve_none >= solve_all:  # an untrained (random) policy gets everything wrong
    return (
      "the problems are too hard for the policy: warm-start it with SFT (sft.steps > 0, "
      "on worked solutions) or start from a trained checkpoint (model.path)"
    )
  return "the problems are too easy for the policy: give harder ones"


def gather_groups(ctx: Rollout, pool: Draws, step: int):
  """Groups of prompts drawn from `pool` until `prompts_per_step` usable ones (or the round
  budget) are reached.

  Returns (kept groups, all sampled groups, rounds used), also reported to ctx
  (`Rollout.report_rollouts`). Raises NoSignalError when dynamic sampling found no
  mixed group at all within the budget.
  """
  cfg = ctx.rl
  kept, sampled = [], []
  need = cfg.prompts_per_step
  for round_ in range(cfg.max_extra_rounds + 1):
    missing = need - len(kept)
    count = need if round_ == 0 else int(np.ceil(missing * cfg.oversample))
    groups = ctx.groups(pool.draw(count), cfg.sampling_params(step_seed(cfg.seed, step, round_)))
    if not groups:
      continue
    sampled += groups
    kept += [g for g in groups if g.mixed or not cfg.dynamic_sampling][:missing]
    if len(kept) >= need or not cfg.dynamic_sampling:
      ctx.report_rollouts(sampled, kept, round_ + 1)
      return kept, sampled, round_ + 1
  if not sampled:
    raise NoSignalError(
      f"step {step}: every drawn prompt is longer than max_prompt_len "
      f"({cfg.max_prompt_len} tokens); raise rl.loop.max_prompt_len"
    )
  if not kept:
    rates = stats.group_stats(np.stack([g.correct for g in sampled]))
    raise NoSignalError(
      f"step {step}: no group with mixed rewards in {len(sampled)} prompts over "
      f"{cfg.max_extra_rounds + 1} rounds (solve_all {rates['solve_all']:.0%}, "
      f"solve_none {rates['solve_none']:.0%}); "
      f"{no_signal_fix(rates['solve_all'], rates['solve_none'])}; "
      "or raise rl.loop.max_extra_rounds"
    )
  ctx.report_rollouts(sampled, kept, cfg.max_extra_rounds + 1)
  return kept, sampled, cfg.max_extra_rounds + 1


def rollout_metrics(
  sampled: Sequence[Group], kept: Sequence[Group], rounds: int, cfg: RLConfig
) -> dict[str, float]:
  """Accuracy, solve rates, lengths, repetition and batch fill of one step's rollouts."""
  correct = np.stack([g.correct for g in sampled])
  lengths = np.array([len(c.token_ids) for g in sampled for c in g.completions])
  trunc = np.array([c.finish_reason == "length" for g in sampled for c in g.completions])
  out = stats.group_stats(correct)
  out.update(
    {
      "reward_mean": float(np.mean([g.rewards.mean() for g in sampled])),
      "response_len_mean": float(lengths.mean()),
      "response_len_max": int(lengths.max()),
      "truncated_frac": float(trunc.mean()),
      "repeated_3gram_frac": float(
        np.mean([_repetition(c) for g in sampled for c in g.completions])
      ),
      "groups_kept": len(kept),
      "batch_fill": len(kept) / cfg.prompts_per_step,
      "prompts_sampled": len(sampled),
      "sample_rounds": rounds,
    }
  )
  out.update(episode_metrics([c for g in sampled for c in g.completions]))
  return out


def _repetition(c) -> float:
  """`stats.repeated_3gram_frac` of the tokens the policy wrote (an episode's observations
  left out)."""
  ids = c.token_ids if c.loss_mask is None else [t for t, m in zip(c.token_ids, c.loss_mask) if m]
  return stats.repeated_3gram_frac(ids)
