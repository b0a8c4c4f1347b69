"""The GRPO learner: TrainState, optimizer and the sharded, jitted update step.

`make_update_fn(...)` returns `update(state, batch) -> (state, metrics)`: it
recomputes the completion-token logprobs, applies the policy loss
`LearnerConfig.policy_loss` names (`objectives.POLICY_LOSSES`) with the optional mismatch
correction (truncated IS per token or sequence, sequence masking), accumulates
gradients over micro-batches with the loss normaliser of the WHOLE batch (so 1 or k
micro-batches give the same step), clips the global gradient norm and takes one AdamW
step, none when the loss or the gradient norm is not finite (`Learner.update` then raises
`NonFiniteError`). State is donated.

With `LearnerConfig.lora.rank > 0` the trained pytree (`TrainState.params`,
and so the optimizer state) is the LoRA adapters, the frozen base rides in
`LoraTrainState.base` (in the compute dtype; it is also the KL reference), and the
loss sees `lora.Adapted(base, adapters)`: each adapted projection adds x A (sB) to x W
inside its layer (`rlvr.model.lora`). `policy_params(state)` is
the policy's weights either way; `policy_weights(state)` is what a sampler is handed
(with LoRA, `lora.Adapted`: a sampler that serves adapters takes only those).

This file is the package's public API; the code lives in `config` (LearnerConfig,
TrainBatch), `state` (states, optimizer, shardings), `logprobs` (log-prob passes,
masks), `update` (the loss and the update step), `nonfinite` (an update whose loss or
gradient is not finite is not applied: `NonFiniteError`), `packing` and `ppo`; `learner` holds
`Learner`, the state and the buffer-to-update path as one RL step uses them.
"""

from rlvr.learner.config import RL_ONLY, LearnerConfig, TrainBatch
from rlvr.learner.learner import Learner
from rlvr.learner.logprobs import batch_logprobs, loss_mask, make_logprob_fn
from rlvr.learner.nonfinite import NonFiniteError
from rlvr.learner.packing import BatchShape
from rlvr.learner.state import (
  LoraTrainState,
  TrainState,
  init_state,
  new_state,
  policy_params,
  policy_weights,
  reference_params,
  reset_optimizer,
  state_shardings,
)
from rlvr.learner.update import jit_train_step, make_update_fn, train_step

__all__ = [
  "RL_ONLY",
  "BatchShape",
  "Learner",
  "LearnerConfig",
  "LoraTrainState",
  "NonFiniteError",
  "TrainBatch",
  "TrainState",
  "batch_logprobs",
  "init_state",
  "jit_train_step",
  "loss_mask",
  "make_logprob_fn",
  "make_update_fn",
  "new_state",
  "policy_params",
  "policy_weights",
  "reference_params",
  "reset_optimizer",
  "state_shardings",
  "train_step",
]
