"""GRPO maths as pure jnp functions: advantages, policy losses, KL, entropy, mismatch weights.

The package's public API; import it as `from rlvr import objectives` and call
`objectives.policy_loss(...)`. Each submodule holds one concept:

- `advantage_estimators`: group-relative advantages, the estimators and the `ADVANTAGES`
  registry (`advantage_fn`, `advantages`)
- `aggregation`: masked sums, per-sequence means, `aggregate`, `loss_normalizer`
- `losses`: the clipped surrogate, the policy losses and the `POLICY_LOSSES` registry
  (`policy_loss_fn`, `policy_loss`)
- `regularizers`: KL penalty, entropy, truncated importance weights, token log-probs

Shapes: g groups of n responses, b = g*n sequences, t tokens. `*_bt` arrays
are aligned to target tokens: entry [b, t] belongs to token t of row b, its
log-probability taken from the logits at t-1; `mask_bt` is 1 where the token
is a completion token that counts in the loss.

Two registries pick the objective by name (docs/methods.md#objectives-and-advantage-estimators),
each in its own file beside the functions it names:
`POLICY_LOSSES` in `losses.py` (`rl.learner.policy_loss`: grpo, gspo, gspo_token, cispo) and
`ADVANTAGES` in `advantage_estimators.py` (`rl.learner.advantage`: grpo, dr_grpo, rloo,
reinforce++, reinforce++_baseline); either also takes "package.module:function" for one
defined elsewhere.
"""

from rlvr.objectives.advantage_estimators import (
  ADVANTAGES,
  advantage_fn,
  advantages,
  dr_grpo_advantages,
  group_advantages,
  grpo_advantages,
  reinforce_pp_advantages,
  reinforce_pp_baseline_advantages,
  rloo_advantages,
)
from rlvr.objectives.aggregation import (
  AGGREGATIONS,
  aggregate,
  by_token,
  loss_normalizer,
  masked_sum,
  sequence_mean,
  to_tokens,
)
from rlvr.objectives.losses import (
  POLICY_LOSSES,
  cispo_loss,
  clipped_surrogate,
  grpo_loss,
  gspo_loss,
  gspo_token_loss,
  policy_loss,
  policy_loss_fn,
)
from rlvr.objectives.regularizers import (
  TIS_LEVELS,
  entropy_from_logits,
  k3,
  kl_penalty,
  next_token_logprobs,
  positions_logprobs_and_entropy,
  token_logprobs_and_entropy,
  truncated_is_weight,
)

__all__ = [
  "ADVANTAGES",
  "AGGREGATIONS",
  "POLICY_LOSSES",
  "TIS_LEVELS",
  "advantage_fn",
  "advantages",
  "aggregate",
  "by_token",
  "cispo_loss",
  "clipped_surrogate",
  "dr_grpo_advantages",
  "entropy_from_logits",
  "group_advantages",
  "grpo_advantages",
  "grpo_loss",
  "gspo_loss",
  "gspo_token_loss",
  "k3",
  "kl_penalty",
  "loss_normalizer",
  "masked_sum",
  "policy_loss",
  "policy_loss_fn",
  "reinforce_pp_advantages",
  "reinforce_pp_baseline_advantages",
  "rloo_advantages",
  "sequence_mean",
  "to_tokens",
  "next_token_logprobs",
  "positions_logprobs_and_entropy",
  "token_logprobs_and_entropy",
  "truncated_is_weight",
]
