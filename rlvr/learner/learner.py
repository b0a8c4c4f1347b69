"""The learner as one RL step uses it: the policy's training state and the update of a buffer.

`Learner.update(groups, step)` reads as its phases: the buffer's advantages, computed once
over all of it (`packing.group_advantages`), its mini-batches (`ppo.mini_batches`), each
packed into the arrays of a `TrainBatch` (`packing.build_batch`) and placed on the mesh,
then the optimizer step(s) (`ppo.update_on_batches`). The state stays on the learner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from rlvr.learner import nonfinite, packing, ppo
from rlvr.learner.config import LearnerConfig, TrainBatch
from rlvr.learner.logprobs import make_logprob_fn
from rlvr.learner.state import policy_weights, reset_optimizer
from rlvr.learner.update import make_update_fn
from rlvr.parallel import distributed


@dataclasses.dataclass
class Learner:
  """The policy being trained and how.

  state: a `TrainState` (or `LoraTrainState`); update_fn(state, batch) -> (state, metrics),
  the jitted update (`make_update_fn`); to_batch(arrays) -> a `TrainBatch` on the learner's
  devices; cfg: its settings (`LearnerConfig`: besides the optimiser and the loss, the
  advantage estimator, mini-batches, epochs, old log-probs and packing); shape: the step's
  batch shapes (`packing.BatchShape`); seed: the run's (mini-batch order); pad_id: the
  tokenizer's; logp_fn(params, batch) -> log-probs (`make_logprob_fn`), needed when a buffer
  makes several optimizer steps.
  """

  state: Any
  update_fn: Callable
  to_batch: Callable[[dict], TrainBatch]
  cfg: LearnerConfig
  shape: packing.BatchShape
  seed: int
  pad_id: int
  logp_fn: Callable | None = None

  @classmethod
  def build(
    cls,
    model_cfg,
    cfg: LearnerConfig,
    mesh,
    state,
    shape: packing.BatchShape,
    seed: int,
    pad_id: int,
  ) -> "Learner":
    """The learner of a run: its jitted functions over `mesh`; batches split over the mesh's
    data-parallel axes (every process holds the whole batch: `distributed.replicated_batch`)."""
    return cls(
      state,
      make_update_fn(model_cfg, cfg, mesh),
      lambda arrays: TrainBatch(**distributed.replicated_batch(arrays, mesh)),
      cfg,
      shape,
      seed,
      pad_id,
      make_logprob_fn(model_cfg, cfg, mesh),
    )

  def update(self, groups: Sequence, step: int) -> dict[str, float]:
    """The optimizer step(s) on a buffer of scored groups; returns the learner's metrics.
    A loss or gradient that is not finite raises `nonfinite.NonFiniteError` (one line);
    that optimizer step was not applied to `state`."""
    cfg = self.cfg
    advantages = packing.group_advantages(groups, cfg)
    rng = ppo.shuffle_rng(self.seed, step)
    chunks = ppo.mini_batches(list(zip(groups, advantages)), cfg, rng)
    one = ppo.one_update(len(chunks), cfg)
    batches = [
      self.to_batch(
        packing.build_batch(
          [g for g, _ in chunk],
          cfg,
          self.shape,
          self.pad_id,
          advantages=[a for _, a in chunk],
          min_rows=None if one else self.shape.mini_batch_rows(cfg),
        )
      )
      for chunk in chunks
    ]
    try:
      self.state, metrics = ppo.update_on_batches(
        self.state, self.update_fn, self.logp_fn, batches, cfg, rng, one
      )
    except nonfinite.NonFiniteError as e:
      self.state = e.state  # the update took (donated) the state it was given
      raise
    return metrics

  def weights(self):
    """What a sampler is handed (`policy_weights`)."""
    return policy_weights(self.state)

  def reset_optimizer(self) -> None:
    """Fresh optimizer moments from the next update on (QbQ: every round)."""
    self.state = reset_optimizer(self.state)
