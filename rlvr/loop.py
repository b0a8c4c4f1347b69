"""The step every RL method shares: rollouts, dynamic sampling, batch, update, weight sync.

A method (`rlvr/methods/`) only builds the buffer of scored groups for one
update; `rl_step` does the rest the same way for all of them: pack the groups
into bucketed shapes (so the jitted update compiles a handful of times per
run), update, push the new weights to the sampler once, and time the phases.
Everything outside the update is plain Python around the Sampler and the
scorer, reached through a `StepEnv`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from rlvr import grpo, learner, metrics as metrics_lib
from rlvr.sampling.types import Completion, Sampler, SamplingParams


class NoSignalError(RuntimeError):
  """Every sampled group had zero reward variance for all allowed rounds."""


@dataclasses.dataclass(frozen=True)
class RLConfig:
  prompts_per_step: int = 32        # groups in one update
  group_size: int = 8               # G responses per prompt
  max_prompt_len: int = 128
  max_response_len: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  dynamic_sampling: bool = True     # keep only groups with 0 < acc < 1
  max_extra_rounds: int = 3         # bounded over-sampling rounds per step
  oversample: float = 2.0           # extra prompts per missing group in later rounds
  normalize_std: bool = True        # False: Dr.GRPO advantages
  seed: int = 0

  def __post_init__(self):
    for name in ("prompts_per_step", "group_size", "max_prompt_len", "max_response_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if self.group_size < 2:
      raise ValueError(f"group_size: GRPO needs >= 2 responses per prompt, got {self.group_size}")
    if self.max_extra_rounds < 0 or self.oversample < 1:
      raise ValueError("max_extra_rounds must be >= 0 and oversample >= 1")

  @property
  def rows(self) -> int:
    return self.prompts_per_step * self.group_size

  @property
  def seq_len(self) -> int:
    total = self.max_prompt_len + self.max_response_len
    return -(-total // 16) * 16

  def sampling_params(self, seed: int) -> SamplingParams:
    return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p,
                          top_k=self.top_k, max_tokens=self.max_response_len, seed=seed)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """A problem as the policy sees it: prompt token ids plus the answer it is scored against.

  Methods draw these from the training set and create new ones (synthetic,
  composed, variants); `source` says where one came from, `text` is the
  problem statement (without chat template) for methods that rewrite it.
  """

  ids: tuple[int, ...]
  answer: str
  text: str = ""
  source: str = ""


@dataclasses.dataclass
class Group:
  """One prompt's G responses, scored."""

  prompt: Prompt
  completions: list[Completion]
  rewards: np.ndarray    # [G] float
  correct: np.ndarray    # [G] bool

  @property
  def mixed(self) -> bool:
    return bool(self.rewards.max() > self.rewards.min())


ScoreFn = Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray]]
GenerateFn = Callable[[list[Sequence[int]], SamplingParams], list[list[Completion]]]


def rollout(generate: GenerateFn, score_fn: ScoreFn, prompts: Sequence[Prompt],
            sp: SamplingParams) -> list[Group]:
  """Samples sp.n responses per prompt (one generate call) and scores them."""
  outs = generate([list(p.ids) for p in prompts], sp)
  texts = [c.text for group in outs for c in group]
  golds = [p.answer for p in prompts for _ in range(sp.n)]
  rewards, correct = score_fn(texts, golds)
  rewards = np.asarray(rewards, np.float32).reshape(len(prompts), sp.n)
  correct = np.asarray(correct, bool).reshape(len(prompts), sp.n)
  return [Group(p, outs[k], rewards[k], correct[k]) for k, p in enumerate(prompts)]


def step_seed(seed: int, step: int, round_: int) -> int:
  """Sampling seed of one generation round, stable across restarts."""
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2 ** 31)


class StepEnv:
  """What a method may use inside one step: sampler, scorer, encoders, the RL config.

  `generate` and `score` go through here so the step tail can time them and
  count generated tokens; `complete` is the text-in / text-out call that
  synthesis functions take. `answer_of` is a task's exact answer of a problem
  text (procedural tasks only): diagnostics, never a training signal.
  """

  def __init__(self, sampler: Sampler, score_fn: ScoreFn, *, rl: RLConfig, pad_id: int,
               encode: Callable[[str], list[int]], encode_task: Callable[[str], list[int]],
               answer_of: Callable[[str], str | None] | None = None):
    self.sampler, self.rl, self.pad_id = sampler, rl, pad_id
    self._score_fn = score_fn
    self.encode, self.encode_task, self.answer_of = encode, encode_task, answer_of
    self.reset()

  def reset(self) -> None:
    self.time_sample = self.time_score = 0.0
    self.generated_tokens = 0

  def generate(self, prompt_ids: list[Sequence[int]], sp: SamplingParams):
    t = time.perf_counter()
    outs = self.sampler.generate(prompt_ids, sp)
    self.time_sample += time.perf_counter() - t
    self.generated_tokens += sum(len(c.token_ids) for g in outs for c in g)
    return outs

  def score(self, texts: list[str], golds: list[str]):
    t = time.perf_counter()
    out = self._score_fn(texts, golds)
    self.time_score += time.perf_counter() - t
    return out

  def rollout(self, prompts: Sequence[Prompt], sp: SamplingParams) -> list[Group]:
    return rollout(self.generate, self.score, prompts, sp)

  def complete(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
    """Chat-templated task prompts (no solving instruction) -> sp.n completions each."""
    return self.generate([self.encode_task(p) for p in prompts], sp)

  def prompt(self, text: str, answer: str, source: str) -> Prompt:
    """A solving prompt for a problem text (the run's instruction and chat template)."""
    return Prompt(tuple(self.encode(text)), answer, text, source)


def gather_groups(env: StepEnv, draw: Callable[[int], list[Prompt]], step: int):
  """Rollouts until `prompts_per_step` usable groups (or the round budget) are reached.

  Returns (kept groups, all sampled groups, rounds used). Raises NoSignalError
  when dynamic sampling found no mixed group at all within the budget.
  """
  cfg = env.rl
  kept, sampled = [], []
  need = cfg.prompts_per_step
  for round_ in range(cfg.max_extra_rounds + 1):
    missing = need - len(kept)
    count = need if round_ == 0 else int(np.ceil(missing * cfg.oversample))
    groups = env.rollout(draw(count), cfg.sampling_params(step_seed(cfg.seed, step, round_)))
    sampled += groups
    kept += [g for g in groups if g.mixed or not cfg.dynamic_sampling][:missing]
    if len(kept) >= need or not cfg.dynamic_sampling:
      return kept, sampled, round_ + 1
  if not kept:
    stats = metrics_lib.group_stats(np.stack([g.correct for g in sampled]))
    raise NoSignalError(
        f"step {step}: no group with mixed rewards in {len(sampled)} prompts over "
        f"{cfg.max_extra_rounds + 1} rounds (solve_all {stats['solve_all']:.0%}, "
        f"solve_none {stats['solve_none']:.0%}); the data is too easy or too hard for "
        "the policy, or raise max_extra_rounds")
  return kept, sampled, cfg.max_extra_rounds + 1


def bucket(n: int, minimum: int, multiple: int = 1) -> int:
  """`minimum` when n fits, else the next power of two >= n (a multiple of `multiple`)."""
  b = minimum if n <= minimum else 1 << (n - 1).bit_length()
  return -(-b // multiple) * multiple


def build_batch(groups: Sequence[Group], cfg: RLConfig, pad_id: int, *, rows: int | None = None,
                seq_len: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded [rows, seq_len] arrays: prompt, then completion (in the loss), then pad.

  Rows beyond the groups are padding (no loss tokens). Advantages are computed
  within each group (`grpo.group_advantages`); groups may differ in size.
  Default shape: cfg.rows x cfg.seq_len, grown to the next power of two when
  the groups need more (a larger buffer, a longer prompt), so shapes stay few.
  """
  completions = [c for g in groups for c in g.completions]
  longest = max((len(g.prompt.ids) + len(c.token_ids) for g in groups for c in g.completions),
                default=0)
  rows = bucket(len(completions), cfg.rows) if rows is None else rows
  seq_len = bucket(longest, cfg.seq_len, 16) if seq_len is None else seq_len
  arrays = learner.pack_rows([(g.prompt.ids, c.token_ids, c.logprobs) for g in groups
                              for c in g.completions], rows, seq_len, pad_id)
  adv = np.zeros((rows,), np.float32)
  truncated = np.zeros((rows,), bool)
  r = 0
  for g in groups:
    adv_g = np.asarray(grpo.group_advantages(np.asarray(g.rewards)[None],
                                             normalize_std=cfg.normalize_std))[0]
    adv[r:r + len(adv_g)] = adv_g
    r += len(adv_g)
  truncated[:len(completions)] = [c.finish_reason == "length" for c in completions]
  return dict(arrays, advantages_b=adv, truncated_b=truncated)


def rollout_metrics(sampled: Sequence[Group], kept: Sequence[Group], rounds: int,
                    cfg: RLConfig) -> dict[str, float]:
  """Accuracy, solve rates, lengths and batch fill of one step's rollouts."""
  correct = np.stack([g.correct for g in sampled])
  lengths = np.array([len(c.token_ids) for g in sampled for c in g.completions])
  trunc = np.array([c.finish_reason == "length" for g in sampled for c in g.completions])
  out = metrics_lib.group_stats(correct)
  out.update({
      "reward_mean": float(np.mean([g.rewards.mean() for g in sampled])),
      "response_len_mean": float(lengths.mean()),
      "response_len_max": int(lengths.max()),
      "truncated_frac": float(trunc.mean()),
      "groups_kept": len(kept),
      "batch_fill": len(kept) / cfg.prompts_per_step,
      "prompts_sampled": len(sampled),
      "sample_rounds": rounds,
  })
  return out


def rl_step(state, update_fn, method, env: StepEnv, step: int, to_batch: Callable[[dict], Any]):
  """One RL step of any method. Returns (new state, metrics).

  method.buffer(env, step) -> (groups, metrics) builds the update's data;
  to_batch: numpy dict -> learner.TrainBatch placed on the mesh (per-process
  rows when multi-host). The sampler gets the new weights at version step + 1,
  also when the buffer is empty and the update is skipped.
  """
  t0 = time.perf_counter()
  env.reset()
  groups, m = method.buffer(env, step)
  m = dict(m)
  t_buffer = time.perf_counter()
  if groups:
    state, learner_metrics = update_fn(state, to_batch(build_batch(groups, env.rl, env.pad_id)))
    m.update({k: float(v) for k, v in learner_metrics.items()})
  t_update = time.perf_counter()
  env.sampler.update_weights(state.params, version=step + 1)
  end = time.perf_counter()
  m.update({
      "skipped_update": int(not groups),
      "time_sample": env.time_sample, "time_score": env.time_score,
      "time_buffer": t_buffer - t0, "time_update": t_update - t_buffer,
      "time_sync": end - t_update, "time_step": end - t0,
      "tokens_per_s": env.generated_tokens / (end - t0),
  })
  return state, m
