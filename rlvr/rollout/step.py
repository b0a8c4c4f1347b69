"""The step every RL method shares, and what a method builds its buffer through.

    rl_step    one step of any method, as its phases in order:
      buffer     the method's buffer (`Buffers.take`: built now, or the one built ahead)
      update     advantages over the whole buffer, mini-batches, optimizer step(s)
      sync       the new weights pushed to the sampler
      samples    the buffer's responses written, on the steps they are due
    Buffers    when a step's buffer is built: at the start of the step (`max_staleness` 0),
               or one step ahead from the weights the sampler holds while the previous
               update runs (`max_staleness` 1), in a worker thread when the sampler runs
               apart from the learner
    Rollout    what a method samples and scores through: `gather` (dynamic sampling) and
               `groups` (a batch of prompts sampled and scored into groups)

The run (`rlvr.run.trainer.Trainer.fit`) adds the rest of a step: evaluation, the metrics
row, exports and checkpoints.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Callable, Sequence

import numpy as np

from rlvr import envs
from rlvr.rewards import shaping
from rlvr.rollout import stats as group_stats
from rlvr.rollout.buffer import Buffer, staleness_metrics, step_timings
from rlvr.rollout.config import RLConfig
from rlvr.rollout.dynamic_sampling import Draws, NoSignalError, no_signal_fix, rollout_metrics
from rlvr.rollout.types import Group, Prompt, RolloutStats, ScoreFn, step_seed
from rlvr.sampling.types import Completion, Sampler, SamplingParams

_LOG = logging.getLogger(__name__)


def rl_step(learner, method, ctx: Rollout, step: int, buffers: Buffers | None = None, samples=None):
  """One RL step of any method (`rlvr.methods.base.Method`) on a `learner.Learner`, whose
  state it advances; returns the step's metrics.

  buffers: when the buffers are built (`Buffers`; default: strict alternation).
  samples: a `samples_log.SamplesLog`; on the steps it is due, it writes the responses of
  the step's buffer (after the step's timings are taken).
  The sampler gets the new weights at version step + 1, also when the buffer is empty and
  the update is skipped. Where `method.resets_optimizer(step)`, that step's update starts
  from fresh optimizer moments (QbQ: every round).

  The metrics describe the buffer the update used (its rollouts, its build's time_sample /
  time_score / time_buffer, staleness) and the step's wall time (`buffer.step_timings`).
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
  m.update(step_timings(clock, buffers.built))
  return m


class Buffers:
  """Where each step's buffer comes from, in step order.

  max_staleness 0: built when the step takes it, from the weights the step updates.
  max_staleness 1: the buffer of step t+1 is built from the weights the sampler holds
  during update t (version t, one behind the update that will use it); step 0's, and
  a resumed run's first when no buffer was saved ahead, are built when taken. With
  `overlap` the build runs in a worker thread while the update runs; without (an
  in-process sampler on the learner's devices, where nothing can overlap) it runs
  just before the update: the same buffers, the same updates, no time saved.
  The buffer built ahead is finished before the weight push (`finish_ahead`), so
  between steps nothing is in flight and `pending` is what a checkpoint saves.
  """

  def __init__(self, method, ctx: Rollout, *, overlap: bool = True, last_step: int | None = None):
    self.method, self.ctx = method, ctx
    self.ahead = ctx.rl.max_staleness == 1
    self.overlap, self.last_step = overlap, last_step
    self.pending: Buffer | None = None
    self.built: list[Buffer] = []  # the builds of the current step, for its timings
    self._future: concurrent.futures.Future | None = None
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "rollouts") if overlap else None

  def take(self, step: int, version: int | None = None) -> Buffer:
    """Step `step`'s buffer: the one built ahead for it, else `method.buffer` on a fork of
    the rollout now, with its rollout metrics and stats. version: the sampler's weight
    version it is built from (a build ahead gives it, and leaves `pending` and `built` to
    its caller); by default the step's own."""
    if version is None:
      if self.pending is not None and self.pending.step == step:
        buf, self.pending, self.built = self.pending, None, []
        return buf
      self.pending = None
    ctx = self.ctx.fork()
    t0 = time.perf_counter()
    groups, m = self.method.buffer(ctx, step)
    m = dict(m)
    if ctx.stats.reported is not None:
      m.update(rollout_metrics(*ctx.stats.reported, ctx.rl))
    m.update(ctx.stats.metrics())
    t1 = time.perf_counter()
    m["time_buffer"] = t1 - t0
    buf = Buffer(step, list(groups), m, step if version is None else version, t0, t1, ctx.stats)
    if version is None:
      self.built = [buf]
    return buf

  def start_ahead(self, step: int) -> None:
    """Begins the next step's buffer from the weights the sampler holds now (version step)."""
    nxt = step + 1
    if not self.ahead or (self.last_step is not None and nxt >= self.last_step):
      return
    if self._pool is not None:
      self._future = self._pool.submit(self.take, nxt, step)
    else:
      self.pending = self.take(nxt, step)
      self.built.append(self.pending)

  def finish_ahead(self) -> None:
    """Waits for the buffer begun by `start_ahead` (errors in its build surface here)."""
    if self._future is not None:
      future, self._future = self._future, None
      self.pending = future.result()
      self.built.append(self.pending)

  def close(self) -> None:
    if self._future is not None:
      self._future.cancel()
      concurrent.futures.wait([self._future])
      self._future = None
    if self._pool is not None:
      self._pool.shutdown(wait=True)


class Rollout:
  """What a method samples and scores through: the sampler, the run's environment, the
  scorer and reward shaping, the encoders and the RL config.

  `gather(pool, step)` is DAPO's dynamic sampling: groups of drawn prompts until the step
  has enough with mixed rewards. `groups(prompts, sp)` is a batch of prompts sampled (sp.n
  responses, or episodes, each) and scored into `Group`s, shaped for the update or
  (shaped=False) the verifier's reward alone, as evaluation and QbQ's solve counts take it.
  Sampling and scoring go through here so that `stats` (`RolloutStats`) times them and
  counts what they produce; episodes take the rollout as their sampler, so their turns are
  counted too. `complete` is the text-in / text-out call that synthesis functions take;
  `well_formed(text)` decides the format bonus; `answer_of` is a task's exact answer of a
  problem text (procedural tasks only): diagnostics, never a training signal. rl=None
  (evaluation): no prompt-length limit and no shaping.
  """

  def __init__(
    self,
    sampler: Sampler,
    score_fn: ScoreFn,
    *,
    rl: RLConfig | None = None,
    encode: Callable[[str], list[int]] | None = None,
    encode_task: Callable[[str], list[int]] | None = None,
    answer_of: Callable[[str], str | None] | None = None,
    shaping_cfg: shaping.ShapingConfig | None = None,
    well_formed: Callable[[str], bool] | None = None,
    episodes: envs.Episodes | None = None,
  ):
    self.sampler, self.rl = sampler, rl
    self.episodes = episodes
    self._score_fn = score_fn
    self.encode, self.encode_task, self.answer_of = encode, encode_task, answer_of
    active = rl is not None and shaping_cfg is not None and shaping_cfg.active
    self.shaping = shaping_cfg if active else None
    if self.shaping is not None and self.shaping.format_bonus and well_formed is None:
      raise ValueError("shaping.format_bonus needs well_formed(text) to tell a final answer")
    self.well_formed = well_formed
    self.reset()

  def reset(self) -> None:
    self.stats = RolloutStats()

  def fork(self) -> Rollout:
    """The same sampler, scorer and encoders with `stats` of its own: one per buffer, so a
    buffer built ahead in a worker thread counts only its own calls."""
    other = object.__new__(Rollout)
    other.__dict__.update(self.__dict__)
    other.reset()
    return other

  def report_rollouts(self, sampled: Sequence[Group], kept: Sequence[Group], rounds: int) -> None:
    """Names the rollouts the step's metrics describe (`rollout_metrics`): the groups
    sampled for the update, those kept, and the sampling rounds. `gather` reports its own;
    a method that builds its buffer otherwise reports what it kept (the last call counts).
    A step that reports nothing has no rollout metrics."""
    self.stats.reported = (list(sampled), list(kept), rounds)

  def gather(self, pool: Draws, step: int) -> tuple[list[Group], list[Group], int]:
    """Groups of prompts drawn from `pool` until `prompts_per_step` usable ones (or the
    round budget) are reached: (kept groups, all sampled groups, rounds used), also
    reported (`report_rollouts`). Raises NoSignalError when dynamic sampling found no mixed
    group at all within the budget."""
    cfg = self.rl
    kept, sampled = [], []
    need = cfg.prompts_per_step
    for round_ in range(cfg.max_extra_rounds + 1):
      missing = need - len(kept)
      count = need if round_ == 0 else int(np.ceil(missing * cfg.oversample))
      groups = self.groups(pool.draw(count), cfg.sampling_params(step_seed(cfg.seed, step, round_)))
      if not groups:
        continue
      sampled += groups
      kept += [g for g in groups if g.mixed or not cfg.dynamic_sampling][:missing]
      if len(kept) >= need or not cfg.dynamic_sampling:
        self.report_rollouts(sampled, kept, round_ + 1)
        return kept, sampled, round_ + 1
    if not sampled:
      raise NoSignalError(
        f"step {step}: every drawn prompt is longer than max_prompt_len "
        f"({cfg.max_prompt_len} tokens); raise rl.loop.max_prompt_len"
      )
    if not kept:
      rates = group_stats.group_stats(np.stack([g.correct for g in sampled]))
      raise NoSignalError(
        f"step {step}: no group with mixed rewards in {len(sampled)} prompts over "
        f"{cfg.max_extra_rounds + 1} rounds (solve_all {rates['solve_all']:.0%}, "
        f"solve_none {rates['solve_none']:.0%}); "
        f"{no_signal_fix(rates['solve_all'], rates['solve_none'])}; "
        "or raise rl.loop.max_extra_rounds"
      )
    self.report_rollouts(sampled, kept, cfg.max_extra_rounds + 1)
    return kept, sampled, cfg.max_extra_rounds + 1

  def groups(self, prompts: Sequence[Prompt], sp: SamplingParams, shaped: bool = True):
    """sp.n responses (or, with a multi-turn environment, episodes) of each prompt that fits
    (`fits`), scored into `Group`s. The scorer gets the text each response's policy wrote
    (`Completion.answer_text`: an episode's observations left out) and its problem
    statement (`Prompt.text`). shaped: the shaping terms added to the verifier's reward
    (the update's groups)."""
    prompts = self.fits(prompts)
    if not prompts:
      return []
    ids, t = [list(p.ids) for p in prompts], time.perf_counter()
    if self.episodes is None or not self.episodes.multi_turn:  # one response each
      outs = self.sampler.generate(ids, sp)
      self._count(outs, t)
    else:  # one episode each (`rlvr.envs`, the `env` section), its turns through `generate`
      outs = self.episodes.generate(self, ids, sp, [p.text for p in prompts])
    flat = [c for group in outs for c in group]
    golds = [p.answer for p in prompts for _ in range(sp.n)]
    problems = [p.text for p in prompts for _ in range(sp.n)]
    rewards, correct = self.score([c.answer_text for c in flat], golds, prompts=problems)
    if shaped and self.shaping is not None:
      rewards = self._shape(flat, rewards)
    rewards = np.asarray(rewards, np.float32).reshape(len(prompts), sp.n)
    correct = np.asarray(correct, bool).reshape(len(prompts), sp.n)
    return [Group(p, outs[k], rewards[k], correct[k]) for k, p in enumerate(prompts)]

  def generate(self, prompt_ids: list[Sequence[int]], sp: SamplingParams):
    """The sampler's completions, timed and counted in `stats`."""
    t = time.perf_counter()
    outs = self.sampler.generate(prompt_ids, sp)
    self._count(outs, t)
    return outs

  def _count(self, outs: list[list[Completion]], since: float) -> None:
    self.stats.time_sample += time.perf_counter() - since
    self.stats.generated_tokens += sum(len(c.token_ids) for g in outs for c in g)

  def score(self, texts: list[str], golds: list[str], prompts: list[str] | None = None):
    """The scorer's (rewards, correct) of the responses. Whatever scored them, a reward
    that is not finite becomes 0 (not correct) and is counted as `verdict_reward_not_finite`:
    nothing but finite rewards reaches the advantages."""
    t = time.perf_counter()
    out = self._score_fn(texts, golds, prompts=prompts)
    self.stats.time_score += time.perf_counter() - t
    for k, v in getattr(out, "counts", {}).items():
      self.stats.verdicts[k] = self.stats.verdicts.get(k, 0) + v
    for k, v in getattr(out, "values", {}).items():
      self.stats.reward_values.setdefault(k, []).extend(v)
    rewards, correct = out
    with np.errstate(over="ignore", invalid="ignore"):
      as_f32 = np.asarray(rewards, np.float64).astype(np.float32)
    bad = ~np.isfinite(as_f32)
    if bad.any():
      k = "reward_not_finite"
      self.stats.verdicts[k] = self.stats.verdicts.get(k, 0) + int(bad.sum())
      _LOG.warning("reward: %d of %d rewards are not finite; they score 0", bad.sum(), bad.size)
      as_f32[bad] = 0.0
      return as_f32, np.where(bad, False, np.asarray(correct, bool))
    return out

  def fits(self, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The prompts of at most rl.max_prompt_len tokens (never cut: the learner must see the
    prompt the sampler saw; without an RL config, all); the rest are counted and dropped."""
    limit = self.rl.max_prompt_len if self.rl is not None else float("inf")
    kept = [p for p in prompts if len(p.ids) <= limit]
    self.stats.prompts_too_long += len(prompts) - len(kept)
    return kept

  def _shape(self, completions, rewards):
    wf = (
      [self.well_formed(c.answer_text) for c in completions]
      if self.shaping.format_bonus
      else [False] * len(completions)
    )
    shaped, terms = shaping.shape(
      rewards, [c.policy_tokens for c in completions], wf, self.shaping, self.rl.max_response_len
    )
    sums = self.stats.shaping_sums
    for k, v in terms.items():
      sums[k] = sums.get(k, 0.0) + float(np.sum(v))
    self.stats.shaped += len(completions)
    return shaped

  def complete(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
    """Chat-templated task prompts (no solving instruction) -> sp.n completions each."""
    return self.generate([self.encode_task(p) for p in prompts], sp)

  def prompt(self, text: str, answer: str, source: str) -> Prompt:
    """A solving prompt for a problem text (the run's instruction and chat template)."""
    return Prompt(tuple(self.encode(text)), answer, text, source)
