"""The step every RL method shares: rollouts, dynamic sampling, metrics, update, weight sync.

A method (`rlvr/methods/`) only builds the buffer of scored groups for one
update; `rl_step` does the rest the same way for all of them: the rollout
metrics of the groups the method reports (`StepEnv.report_rollouts`), the update
on the groups packed into bucketed shapes (`rlvr.learner.ppo`, `rlvr.learner.packing`), one
weight push to the sampler, and the phases' timings. Everything outside the
update is plain Python around the Sampler and the scorer, reached through a
`StepEnv`.

`Rollouts` (`rlvr/rollout/buffer.py`) decides when a step's buffer is built: at the start
of the step (`max_staleness` 0, strict alternation), or one step ahead, from the weights
the sampler holds while the previous update runs (`max_staleness` 1, one-step
off-policy), in a worker thread when the sampler runs apart from the learner.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rlvr import learner
from rlvr.learner import ppo
from rlvr.rollout.buffer import Rollouts, staleness_metrics
from rlvr.rollout.env import StepEnv


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
  return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def rl_step(
  state,
  update_fn,
  method,
  env: StepEnv,
  step: int,
  to_batch: Callable[[dict], Any],
  logp_fn=None,
  rollouts: Rollouts | None = None,
  samples=None,
):
  """One RL step of any method (`rlvr.methods.base.Method`). Returns (new state, metrics).

  method.buffer(env, step) -> (groups, metrics) builds the update's data; the
  rollouts it reports (`StepEnv.report_rollouts`) add `rollout_metrics`.
  to_batch: numpy dict -> learner.TrainBatch placed on the mesh (per-process
  rows when multi-host); logp_fn: the learner's (params, batch) -> logp, needed
  when a buffer makes several optimizer steps (rl.ppo_mini_batch_size, ppo_epochs).
  rollouts: when the buffers are built (`Rollouts`; default: strict alternation).
  samples: a `samples_log.SamplesLog`; on the steps it is due, it writes the responses of
  the step's buffer (after the step's timings are taken).
  The sampler gets the new weights at version step + 1, also when the buffer is
  empty and the update is skipped. Where `method.resets_optimizer(step)`, that
  step's update starts from fresh optimizer moments (QbQ: every round).

  The metrics describe the buffer the update used (rollouts, its build's
  time_sample / time_score / time_buffer, staleness) and the step's wall time:
  time_update, time_sync, time_step, time_learner_idle (the step's time outside the
  update), time_sampler_idle (outside generate calls), overlap_frac (the share of the
  step when a buffer build and the update ran at once) and tokens_per_s (tokens
  generated during the step per second).
  """
  t0 = time.perf_counter()
  own = rollouts is None
  rollouts = rollouts if rollouts is not None else Rollouts(method, env, overlap=False)
  buf = rollouts.take(step)
  groups, m = buf.groups, dict(buf.metrics)
  m.update(staleness_metrics(buf))
  if method.resets_optimizer(step):
    state = learner.reset_optimizer(state)
    m["optimizer_reset"] = 1
  rollouts.start_ahead(step)
  t_update0 = time.perf_counter()
  if groups:
    state, learner_metrics = ppo.update_on_buffer(
      state, update_fn, logp_fn, groups, env.rl, env.pad_id, to_batch, step
    )
    m.update(learner_metrics)
  t_update = time.perf_counter()
  rollouts.finish_ahead()
  t_sync = time.perf_counter()
  env.sampler.update_weights(learner.policy_weights(state), version=step + 1)
  end = time.perf_counter()
  if own:
    rollouts.close()
  if samples is not None and samples.due(step):
    samples.write(step, buf.groups, buf.sampled)
  built = rollouts.built
  step_s = end - t0
  m.update(
    {
      "skipped_update": int(not groups),
      "time_update": t_update - t_update0,
      "time_sync": end - t_sync,
      "time_step": step_s,
      "time_learner_idle": step_s - (t_update - t_update0),
      "time_sampler_idle": step_s - sum(b.metrics["time_sample"] for b in built),
      "overlap_frac": sum(_overlap((b.started, b.ended), (t_update0, t_update)) for b in built)
      / step_s,
      "tokens_per_s": sum(b.generated_tokens for b in built) / step_s,
    }
  )
  return state, m
