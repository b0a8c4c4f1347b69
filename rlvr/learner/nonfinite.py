"""A loss or gradient that is not finite (NaN, inf): the update is not applied, and the
learner says so in one line.

Inside the jitted step (`update.train_step`) the optimizer step runs under `jax.lax.cond`
on the loss and the global gradient norm, which the step computes anyway, being finite:
the taken branch is the optimizer step as it would be without the check; the other returns
the parameters and optimizer moments as they came (the step count and rng do not advance
either). The step's metrics carry `LEAF`, the first parameter whose gradient is not finite
(-1: none), from the per-parameter sums of squares the gradient norm is made of
(`grad_norm`).

On the host, after the update's metrics are fetched (as they are anyway),
`ppo.update_on_batches` raises `NonFiniteError` (`describe`: what was not finite, and where
it came from when the step's inputs or metrics say: the parameters, the advantages, the old
or the sampler's log-probs, the learner's log-probs, the ratio, the KL term).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Sequence

import jax
import jax.numpy as jnp

# The metric with the index of the first parameter (in tree order) whose gradient is not
# finite, -1 when every one is; `ppo.update_on_batches` takes it out of the metrics.
LEAF = "nonfinite_grad_leaf"

# Metrics that locate a non-finite loss, in the order the loss is computed from them
# (ratio_max is -inf, not a fault, where no micro-batch had a loss token).
_STAGES = (
  ("logp", "the learner's log-probs are not finite (their mean: {})"),
  ("entropy", "the learner's entropy is not finite ({})"),
  ("ratio_max", "the ratio to the old policy is not finite (max {})"),
  ("kl", "the KL term is not finite ({})"),
  ("moe_aux_loss", "the load-balancing loss is not finite ({})"),
  ("moe_z_loss", "the router z-loss is not finite ({})"),
  ("pg_loss", "the policy loss is not finite ({})"),
)

# Batch fields (`TrainBatch`) that a loss is computed from, and their names in a message.
_INPUTS = (
  ("advantages", "the advantages"),
  ("old_logp_bt", "the old log-probs"),
  ("sampler_logp_bt", "the sampler's log-probs"),
)


class NonFiniteError(FloatingPointError, ValueError):
  """An update whose loss or gradient was not finite; it was not applied. One line: what
  was not finite and where it came from. `state`: the learner's state after the update
  (the one that went in, when its only optimizer step was the one not applied)."""

  def __init__(self, message: str, state: Any = None):
    super().__init__(message)
    self.state = state


# ------------------------------------------------------------------ in the jitted step
def grad_norm(grads) -> tuple[jax.Array, jax.Array]:
  """(global L2 norm of `grads`, the index of the first leaf whose sum of squares is not
  finite, -1 when none). The norm sums the leaves' sums of squares in tree order, as
  `optax.tree.norm` does."""
  squares = [jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)]
  norm = jnp.sqrt(functools.reduce(operator.add, squares, 0))
  bad = ~jnp.isfinite(jnp.stack(squares))
  return norm, jnp.where(jnp.any(bad), jnp.argmax(bad), -1).astype(jnp.int32)


# ------------------------------------------------------------------ on the host
def is_finite(metrics: dict) -> bool:
  """Whether an optimizer step's update was applied: its loss and gradient norm finite."""
  return math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"]))


def leaf_name(path) -> str:
  """A parameter's path as a/b/c."""
  part = lambda k: getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
  return "/".join(str(part(k)) for k in path)


def _first(x: jax.Array, where: jax.Array | None = None) -> tuple[int, float] | None:
  """(flat index, value) of the first entry of `x` that is not finite (only where `where`,
  of x's shape, is set), None when there is none. Reduced on the devices, only scalars
  fetched (a sharded array of a multi-host run stays where it is)."""
  bad = ~jnp.isfinite(x)
  if where is not None:
    bad = bad & where
  if not bool(jnp.any(bad)):
    return None
  i = int(jnp.argmax(bad.ravel()))
  return i, float(x.ravel()[i])


def _params_cause(params) -> str | None:
  """The first parameter with an entry that is not finite, and that entry."""
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    found = _first(x)
    if found is not None:
      return f"the parameters are not finite before the update ({leaf_name(path)}: {found[1]})"
  return None


def _input_cause(batches: Sequence) -> str | None:
  """The first input of the loss that is not finite on a loss token (an advantage per row:
  on a row with loss tokens), in the first of `batches` that has one."""
  for b, batch in enumerate(batches):
    mask = batch.loss_mask_bt > 0
    for field, name in _INPUTS:
      x = getattr(batch, field)
      found = None if x is None else _first(x, jnp.any(mask, -1) if x.ndim == 1 else mask)
      if found is not None:
        i, value = found
        at = f"row {i}" if x.ndim == 1 else f"row {i // x.shape[1]}, token {i % x.shape[1]}"
        of = f" of mini-batch {b + 1}" if len(batches) > 1 else ""
        return f"{name} are {value} at {at}{of}"
  return None


def _stage_cause(metrics: dict) -> str | None:
  """The first term of the loss (`_STAGES`) whose metric is not finite."""
  for key, text in _STAGES:
    value = float(metrics.get(key, 0.0))
    if not math.isfinite(value) and not (key == "ratio_max" and value == -math.inf):
      return text.format(value)
  return None


def describe(metrics: dict, params, batches: Sequence, names: Sequence[str]) -> str:
  """One line for an optimizer step whose update was not applied: the loss or the gradient
  norm that was not finite, then where it came from, the first that says: `params` (the
  state's), the inputs of `batches` (the update's `TrainBatch`es), the step's metrics, the
  first gradient that was not (`names`: the parameters' names in tree order)."""
  loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
  what = (
    f"the loss is not finite ({loss})"
    if not math.isfinite(loss)
    else f"the gradient norm is not finite ({norm})"
  )
  cause = _params_cause(params) or _input_cause(batches) or _stage_cause(metrics)
  leaf = int(metrics.get(LEAF, -1))
  if cause is None and 0 <= leaf < len(names):
    cause = f"first in the gradient of {names[leaf]}"
  return f"{what}: {cause}" if cause else what
