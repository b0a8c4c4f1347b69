"""Dynamic sampling (DAPO, `step.Rollout.gather`): where its prompts come from (`Draws`), the
error when no group had mixed rewards (`NoSignalError`, `no_signal_fix`), and the metrics of a
step's rollouts (`rollout_metrics`)."""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from rlvr.envs.episode_metrics import episode_metrics
from rlvr.rollout import stats
from rlvr.rollout.config import RLConfig
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
