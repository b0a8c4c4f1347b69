"""The multi-step PPO update of one rollout buffer (verl's): mini-batches, epochs, old logprobs.

`update_on_batches` is what `Learner.update` ends with: one update with the current policy
as the old one when the buffer is one mini-batch of one epoch, otherwise whole groups in
`rl.learner.ppo_mini_batch_size` mini-batches (`mini_batches`), `rl.learner.ppo_epochs` passes, old logprobs
fixed once before the first optimizer step (`multi_step_update`). An optimizer step whose
loss or gradient was not finite was not applied; `update_on_batches` then raises
`nonfinite.NonFiniteError`.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr import objectives
from rlvr.learner import nonfinite
from rlvr.learner.logprobs import completion_mask
from rlvr.learner.state import policy_weights


def mini_batches(groups: Sequence, cfg, rng: np.random.Generator) -> list[list]:
  """Whole groups, `cfg.ppo_mini_batch_size` per mini-batch, in a seeded shuffled order.

  One mini-batch (size 0, or at least as many groups as the buffer) keeps the
  buffer's order.
  """
  k = cfg.ppo_mini_batch_size
  if k <= 0 or len(groups) <= k:
    return [list(groups)]
  order = rng.permutation(len(groups))
  return [[groups[i] for i in order[j : j + k]] for j in range(0, len(groups), k)]


def _mean_over_steps(steps: Sequence[dict]) -> dict[str, float]:
  """Learner metrics of several optimizer steps as one row: means, ratio extremes, token sum."""
  out = {k: float(np.mean([float(m[k]) for m in steps])) for k in steps[0]}
  out["ratio_max"] = max(float(m["ratio_max"]) for m in steps)
  out["ratio_min"] = min(float(m["ratio_min"]) for m in steps)
  out["tokens"] = sum(float(m["tokens"]) for m in steps)
  out["lr"] = float(steps[-1]["lr"])
  return out


def fix_old_logprobs(params, logp_fn, batches: Sequence, source: str = "learner") -> list:
  """The batches with old logprobs: recomputed by the learner (`logp_fn(params, batch)`)
  or the sampler's ("sampler")."""
  if source == "learner":
    return [b.replace(old_logp_bt=logp_fn(params, b)) for b in batches]
  return [b.replace(old_logp_bt=b.sampler_logp_bt) for b in batches]


def drift_kl(params, logp_fn, batches: Sequence) -> float:
  """KL(pi_old || pi_params) over the batches' completion tokens: `objectives.kl_penalty`'s k3
  on the samples of pi_old, whose logprobs are each batch's old_logp_bt."""
  kl_sum = tokens = 0.0
  for b in batches:
    mask = completion_mask(b)
    kl_sum += float(
      objectives.masked_sum(objectives.kl_penalty(b.old_logp_bt, logp_fn(params, b)), mask)
    )
    tokens += float(jnp.sum(mask))
  return kl_sum / max(tokens, 1.0)


def multi_step_update(
  state,
  update_fn,
  logp_fn,
  batches: Sequence,
  epochs: int = 1,
  old_logp: str = "learner",
  rng: np.random.Generator | None = None,
):
  """Several optimizer steps on one rollout's mini-batches (verl's PPO update).

  Old logprobs are fixed once, before the first step (`fix_old_logprobs`). Each
  mini-batch is one optimizer step with its own loss normaliser; epochs after the
  first visit the mini-batches in a new seeded order. Returns (state, per-step
  learner metrics, KL(first policy || last policy) over the rollout's completion
  tokens, `drift_kl`).
  """
  rng = rng or np.random.default_rng(0)
  batches = fix_old_logprobs(policy_weights(state), logp_fn, batches, old_logp)
  steps = []
  for epoch in range(epochs):
    order = range(len(batches)) if epoch == 0 else rng.permutation(len(batches))
    for i in order:
      state, m = update_fn(state, batches[i])
      steps.append(m)
  return state, steps, drift_kl(policy_weights(state), logp_fn, batches)


def shuffle_rng(seed: int, step: int) -> np.random.Generator:
  """The seeded order of a step's mini-batches and epochs (the same on every process)."""
  return np.random.default_rng((seed, step, 17))


def one_update(batches: int, cfg) -> bool:
  """Whether `batches` mini-batches under `cfg` make exactly one optimizer step (one batch,
  one epoch): the current policy is then the old one (ratio 1)."""
  return batches == 1 and cfg.ppo_epochs == 1


def update_on_batches(
  state, update_fn, logp_fn, batches: Sequence, cfg, rng: np.random.Generator, one: bool
) -> tuple[Any, dict[str, float]]:
  """The optimizer step(s) on a buffer's batches (one per mini-batch) under the
  `LearnerConfig` cfg; returns (state, metrics).

  one (`one_update`: one batch and one epoch): exactly one update with the current policy as
  the old one (ratio 1); otherwise `multi_step_update` (epochs in `rng`'s order), which needs
  logp_fn.
  An optimizer step whose loss or gradient norm was not finite was not applied (the steps
  after it were): raises `nonfinite.NonFiniteError` naming the first, with the state.
  """
  if one:
    state, m = update_fn(state, batches[0])
    steps, kl = [m], None
  elif logp_fn is None:
    raise ValueError(
      "ppo_mini_batch_size / ppo_epochs: several optimizer steps per rollout need "
      "logp_fn (learner.make_logprob_fn) to fix the old logprobs"
    )
  else:
    state, steps, kl = multi_step_update(
      state, update_fn, logp_fn, batches, cfg.ppo_epochs, cfg.old_logp, rng
    )
  steps = [{k: float(v) for k, v in m.items()} for m in steps]
  check_finite(state, steps, batches)
  for m in steps:
    m.pop(nonfinite.LEAF, None)
  if kl is None:
    return state, dict(steps[0], optimizer_steps=1)
  return state, dict(_mean_over_steps(steps), optimizer_steps=len(steps), kl_first_last=kl)


def check_finite(state, steps: Sequence[dict], batches: Sequence) -> None:
  """Raises `nonfinite.NonFiniteError` for the first optimizer step (of the float metrics
  `steps`, made on `batches`, the mini-batches) whose update was not applied, with `state`."""
  bad = next((i for i, m in enumerate(steps) if not nonfinite.is_finite(m)), None)
  if bad is None:
    return
  names = [nonfinite.leaf_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.params)]
  line = nonfinite.describe(steps[bad], policy_weights(state), batches, names)
  if len(steps) > 1:
    line = f"optimizer step {bad + 1} of {len(steps)}: {line}"
  raise nonfinite.NonFiniteError(f"{line}; that update was not applied", state)
