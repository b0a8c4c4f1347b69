"""The rollout of a step (`Rollout`: the sampler, the environment, the scorer and shaping,
offering scored groups of prompts), what its calls cost and met (`RolloutStats`) and the
sampling seed of a generation round (`step_seed`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import numpy as np

from rlvr import envs
from rlvr.rewards import shaping
from rlvr.rollout.config import RLConfig
from rlvr.rollout.types import Group, Prompt
from rlvr.sampling.types import Completion, Sampler, SamplingParams

_LOG = logging.getLogger(__name__)

# (texts, golds, prompts=None) -> (rewards, correct): prompts, the problem statement of each text
ScoreFn = Callable[..., tuple[np.ndarray, np.ndarray]]


def step_seed(seed: int, step: int, round_: int) -> int:
  """Sampling seed of one generation round, stable across restarts."""
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2**31)


@dataclasses.dataclass
class RolloutStats:
  """What one buffer's build cost and met, counted as its calls go through a `Rollout`.

  time_sample / time_score: seconds in the sampler's generate and in the scorer;
  generated_tokens: tokens the generate calls produced (a timing: a resumed method may reuse
  stored work); prompts_too_long: prompts dropped for rl.max_prompt_len; shaping_sums /
  shaped: the shaping terms summed over the shaped responses; verdicts: responses per
  verifier verdict; reward_values: a verifier's named values, per response; reported: the
  groups the step's rollout metrics describe (`Rollout.report_rollouts`).
  """

  time_sample: float = 0.0
  time_score: float = 0.0
  generated_tokens: int = 0
  prompts_too_long: int = 0
  shaping_sums: dict[str, float] = dataclasses.field(default_factory=dict)
  shaped: int = 0
  verdicts: dict[str, int] = dataclasses.field(default_factory=dict)
  reward_values: dict[str, list] = dataclasses.field(default_factory=dict)
  reported: tuple[list[Group], list[Group], int] | None = None

  @property
  def sampled(self) -> list[Group]:
    """The groups sampled for the update, as reported (none when nothing was)."""
    return list(self.reported[0]) if self.reported is not None else []

  def metrics(self) -> dict[str, float]:
    """The counters as metrics (the rollout metrics of the reported groups aside)."""
    return {
      "prompts_too_long": self.prompts_too_long,
      **{k: v / max(self.shaped, 1) for k, v in self.shaping_sums.items()},
      **{f"verdict_{k}": v for k, v in self.verdicts.items()},
      **{k: sum(v) / max(len(v), 1) for k, v in self.reward_values.items()},
      "time_sample": self.time_sample,
      "time_score": self.time_score,
    }


class Rollout:
  """What a method samples and scores through: the sampler, the run's environment, the
  scorer and reward shaping, the encoders and the RL config.

  `groups(prompts, sp)` is a batch of prompts sampled (sp.n responses, or episodes, each)
  and scored into `Group`s, shaped for the update or (shaped=False) the verifier's reward
  alone, as evaluation and QbQ's solve counts take it. `generate` and `score` go through
  here so that `stats` (`RolloutStats`) times them and counts what they produce; episodes
  take the rollout as their sampler, so their turns are counted too. `complete` is the
  text-in / text-out call that synthesis functions take; `well_formed(text)` decides the
  format bonus; `answer_of` is a task's exact answer of a problem text (procedural tasks
  only): diagnostics, never a training signal. rl=None (evaluation): no prompt-length limit
  and no shaping.
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
    sampled for the update, those kept, and the sampling rounds. `gather_groups`
    reports its own; a method that builds its buffer otherwise reports what it kept
    (the last call counts). A step that reports nothing has no rollout metrics."""
    self.stats.reported = (list(sampled), list(kept), rounds)

  def generate(self, prompt_ids: list[Sequence[int]], sp: SamplingParams):
    t = time.perf_counter()
    outs = self.sampler.generate(prompt_ids, sp)
    self.stats.time_sample += time.perf_counter() - t
    self.stats.generated_tokens += sum(len(c.token_ids) for g in outs for c in g)
    return outs

  def solve(self, prompts: Sequence[Prompt], sp: SamplingParams) -> list[list[Completion]]:
    """sp.n attempts at each prompt: one response each, or with a multi-turn environment
    (`rlvr.envs`, the `env` section) one episode each, as one `Completion`."""
    return envs.solve(self, self.episodes, prompts, sp)

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

  def fit_mask(self, prompts: Sequence[Prompt]) -> list[bool]:
    """Which prompts are of at most rl.max_prompt_len tokens (never cut: the learner must see
    the prompt the sampler saw); without an RL config, all."""
    limit = self.rl.max_prompt_len if self.rl is not None else float("inf")
    return [len(p.ids) <= limit for p in prompts]

  def fits(self, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The prompts that fit (`fit_mask`); the rest are counted and dropped."""
    kept = [p for p, ok in zip(prompts, self.fit_mask(prompts)) if ok]
    self.stats.prompts_too_long += len(prompts) - len(kept)
    return kept

  def groups(self, prompts: Sequence[Prompt], sp: SamplingParams, shaped: bool = True):
    """sp.n responses (or episodes: `solve`) of each prompt that fits (`fits`), scored into
    `Group`s. The scorer gets the text each response's policy wrote (`Completion.answer_text`:
    an episode's observations left out) and its problem statement (`Prompt.text`).
    shaped: the shaping terms added to the verifier's reward (the update's groups)."""
    prompts = self.fits(prompts)
    if not prompts:
      return []
    outs = self.solve(prompts, sp)
    flat = [c for group in outs for c in group]
    golds = [p.answer for p in prompts for _ in range(sp.n)]
    problems = [p.text for p in prompts for _ in range(sp.n)]
    rewards, correct = self.score([c.answer_text for c in flat], golds, prompts=problems)
    if shaped and self.shaping is not None:
      rewards = self._shape(flat, rewards)
    rewards = np.asarray(rewards, np.float32).reshape(len(prompts), sp.n)
    correct = np.asarray(correct, bool).reshape(len(prompts), sp.n)
    return [Group(p, outs[k], rewards[k], correct[k]) for k, p in enumerate(prompts)]

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
