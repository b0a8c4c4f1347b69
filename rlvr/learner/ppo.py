"""The multi-step PPO update of one rollout buffer (verl's): mini-batches, epochs, old logprobs.

`update_on_buffer` is what `rollout.rl_step` calls with a method's groups: one
update with the current policy as the old one when the buffer is one mini-batch
of one epoch, otherwise whole groups in `rl.ppo_mini_batch_size` mini-batches,
`rl.ppo_epochs` passes, old logprobs fixed once before the first optimizer step.
The advantages (`rl.advantage`) are computed once over the whole buffer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from rlvr import objectives
from rlvr.learner import packing
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


def buffer_advantages(groups: Sequence, cfg) -> list[np.ndarray]:
  """One advantage array per group of the whole buffer, by `cfg.advantage_estimator`
  (`objectives.advantages`), computed before any mini-batch split, so batch-normalised
  estimators (REINFORCE++) see every group of the rollout."""
  return objectives.advantages(
    cfg.advantage_estimator,
    [g.rewards for g in groups],
    [np.array([c.policy_tokens for c in g.completions]) for g in groups],
    cfg.adv_std_ddof,
  )


def batch_arrays(groups: Sequence, advantages: Sequence, cfg, pad_id: int, **shape) -> dict:
  """`packing.build_batch`'s arrays of the groups, holding the given per-group advantages
  (one sequence per row: [rows]; packed rows: on every token of each sequence, placed as
  build_batch packs them, `packing.first_fit` on the rows' width)."""
  arrays = packing.build_batch(groups, cfg, pad_id, **shape)
  adv = np.concatenate([np.zeros(0, np.float32), *advantages]).astype(np.float32)
  rows = arrays["tokens_bt"].shape[0]
  if not cfg.pack:
    return dict(arrays, advantages=np.pad(adv, (0, rows - len(adv))))
  lengths = [len(g.prompt.ids) + len(c.token_ids) for g in groups for c in g.completions]
  bins = packing.first_fit(lengths, arrays["tokens_bt"].shape[1])
  table = np.zeros((rows, 1 + max((len(b) for b in bins), default=0)), np.float32)
  for r, members in enumerate(bins):
    table[r, 1 : 1 + len(members)] = adv[members]  # segment s of row r: sequence members[s-1]
  return dict(arrays, advantages=np.take_along_axis(table, arrays["segment_bt"], axis=1))


def update_on_buffer(
  state,
  update_fn,
  logp_fn,
  groups: Sequence,
  cfg,
  pad_id: int,
  to_batch: Callable[[dict], Any],
  step: int,
):
  """The optimizer step(s) on a buffer of `rollout.Group`s under the `rollout.RLConfig` cfg.

  One mini-batch and one epoch: exactly one update with the current policy as the
  old one (ratio 1); otherwise `multi_step_update`, which needs logp_fn.
  """
  rng = np.random.default_rng((cfg.seed, step, 17))
  chunks = mini_batches(list(zip(groups, buffer_advantages(groups, cfg))), cfg, rng)
  arrays = lambda chunk, **shape: batch_arrays(*zip(*chunk), cfg, pad_id, **shape)
  if len(chunks) == 1 and cfg.ppo_epochs == 1:
    state, m = update_fn(state, to_batch(arrays(chunks[0])))
    return state, dict({k: float(v) for k, v in m.items()}, optimizer_steps=1)
  if logp_fn is None:
    raise ValueError(
      "ppo_mini_batch_size / ppo_epochs: several optimizer steps per rollout need "
      "logp_fn (learner.make_logprob_fn) to fix the old logprobs"
    )
  batches = [to_batch(arrays(c, min_rows=cfg.mini_batch_rows)) for c in chunks]
  state, steps, kl = multi_step_update(
    state, update_fn, logp_fn, batches, cfg.ppo_epochs, cfg.old_logp, rng
  )
  return state, dict(_mean_over_steps(steps), optimizer_steps=len(steps), kl_first_last=kl)
