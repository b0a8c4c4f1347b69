"""The step every RL method shares, as its phases in order.

    buffer   the method draws prompts, generates and scores them into groups
             (`Method.buffer` through a `Rollout`; dynamic sampling for plain GRPO)
    update   advantages over the whole buffer, mini-batches packed into rows, optimizer
             step(s) (`Learner.update`)
    sync     the new weights pushed to the sampler (`Sampler.update_weights`)
    samples  the responses of the buffer written, on the steps they are due

`Buffers` (`rlvr/rollout/buffer.py`) decides when a step's buffer is built: at the start
of the step (`max_staleness` 0, strict alternation), or one step ahead, from the weights
the sampler holds while the previous update runs (`max_staleness` 1, one-step
off-policy), in a worker thread when the sampler runs apart from the learner. The run
(`rlvr.run.trainer.Trainer.train`) adds the rest of a step: evaluation, the metrics row, exports
and checkpoints.
"""

from __future__ import annotations

import time

from rlvr.rollout.buffer import Buffer, Buffers, staleness_metrics
from rlvr.rollout.context import Rollout


def rl_step(
  learner,
  method,
  ctx: Rollout,
  step: int,
  buffers: Buffers | None = None,
  samples=None,
) -> dict:
  """One RL step of any method (`rlvr.methods.base.Method`) on a `learner.Learner`, whose
  state it advances; returns the step's metrics.

  buffers: when the buffers are built (`Buffers`; default: strict alternation).
  samples: a `samples_log.SamplesLog`; on the steps it is due, it writes the responses of
  the step's buffer (after the step's timings are taken).
  The sampler gets the new weights at version step + 1, also when the buffer is
  empty and the update is skipped. Where `method.resets_optimizer(step)`, that
  step's update starts from fresh optimizer moments (QbQ: every round).

  The metrics describe the buffer the update used (its rollouts, its build's
  time_sample / time_score / time_buffer, staleness) and the step's wall time:
  time_update, time_sync, time_step, time_learner_idle (the step's time outside the
  update), time_sampler_idle (outside generate calls), overlap_frac (the share of the
  step when a buffer build and the update ran at once) and tokens_per_s (tokens
  generated during the step per second).
  """
  clock = {"start": time.perf_counter()}
  own = buffers is None
  buffers = buffers if buffers is not None else Buffers(method, ctx, overlap=False)

  buf = buffers.take(step)  # buffer
  m = {**buf.metrics, **staleness_metrics(buf)}
  if method.resets_optimizer(step):
    learner.reset_optimizer()
    m["optimizer_reset"] = 1
  buffers.start_ahead(step)  # the next step's buffer, with max_staleness 1

  clock["update"] = time.perf_counter()  # update
  if buf.groups:
    m.update(learner.update(buf.groups, step))
  clock["update_end"] = time.perf_counter()
  buffers.finish_ahead()

  clock["sync"] = time.perf_counter()  # sync
  ctx.sampler.update_weights(learner.weights(), version=step + 1)
  clock["end"] = time.perf_counter()
  if own:
    buffers.close()

  if samples is not None and samples.due(step):  # samples
    samples.write(step, buf.groups, buf.stats.sampled)
  m["skipped_update"] = int(not buf.groups)
  m.update(_timings(clock, buffers.built))
  return m


def _timings(clock: dict[str, float], built: list[Buffer]) -> dict[str, float]:
  """The step's wall-clock metrics from its phase stamps and the buffers built during it."""
  step_s = clock["end"] - clock["start"]
  update = (clock["update"], clock["update_end"])
  overlap = lambda b: max(0.0, min(b.ended, update[1]) - max(b.started, update[0]))
  return {
    "time_update": update[1] - update[0],
    "time_sync": clock["end"] - clock["sync"],
    "time_step": step_s,
    "time_learner_idle": step_s - (update[1] - update[0]),
    "time_sampler_idle": step_s - sum(b.metrics["time_sample"] for b in built),
    "overlap_frac": sum(overlap(b) for b in built) / step_s,
    "tokens_per_s": sum(b.stats.generated_tokens for b in built) / step_s,
  }
