"""One RL step: rollout -> score -> dynamic sampling -> batch -> update -> weight sync.

Everything outside `update` is plain Python around the Sampler and the reward
pool; the step's shapes are fixed (prompts_per_step x group_size rows, one
token bucket), so the jitted update compiles once per run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from rlvr import grpo, metrics as metrics_lib
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


@dataclasses.dataclass
class Group:
  """One prompt's G responses, scored."""

  example: int
  prompt_ids: list[int]
  completions: list[Completion]
  rewards: np.ndarray    # [G] float
  correct: np.ndarray    # [G] bool

  @property
  def mixed(self) -> bool:
    return bool(self.rewards.max() > self.rewards.min())


ScoreFn = Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray]]


def rollout(sampler: Sampler, examples: Sequence[int], prompt_ids: Sequence[Sequence[int]],
            answers: Sequence[str], score_fn: ScoreFn, sp: SamplingParams) -> list[Group]:
  """Samples sp.n responses per prompt and scores them against the answers."""
  outs = sampler.generate([prompt_ids[i] for i in examples], sp)
  texts = [c.text for group in outs for c in group]
  golds = [answers[i] for i in examples for _ in range(sp.n)]
  rewards, correct = score_fn(texts, golds)
  rewards = np.asarray(rewards, np.float32).reshape(len(examples), sp.n)
  correct = np.asarray(correct, bool).reshape(len(examples), sp.n)
  return [Group(int(e), list(prompt_ids[e]), outs[k], rewards[k], correct[k])
          for k, e in enumerate(examples)]


def step_seed(seed: int, step: int, round_: int) -> int:
  """Sampling seed of one generation round, stable across restarts."""
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2 ** 31)


def gather_groups(sampler: Sampler, draw: Callable[[int], list[int]], prompt_ids, answers,
                  score_fn: ScoreFn, cfg: RLConfig, step: int):
  """Rollouts until `prompts_per_step` usable groups (or the round budget) are reached.

  Returns (kept groups, all sampled groups, rounds used). Raises NoSignalError
  when dynamic sampling found no mixed group at all within the budget.
  """
  kept, sampled = [], []
  need = cfg.prompts_per_step
  for round_ in range(cfg.max_extra_rounds + 1):
    missing = need - len(kept)
    count = need if round_ == 0 else int(np.ceil(missing * cfg.oversample))
    groups = rollout(sampler, draw(count), prompt_ids, answers, score_fn,
                     cfg.sampling_params(step_seed(cfg.seed, step, round_)))
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


def build_batch(groups: Sequence[Group], cfg: RLConfig, pad_id: int, *, rows: int | None = None,
                seq_len: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded [rows, seq_len] arrays: prompt, then completion (in the loss), then pad.

  Rows beyond the groups are padding (no loss tokens). Advantages are computed
  within each group (`grpo.group_advantages`); groups may differ in size.
  Defaults: cfg.rows x cfg.seq_len (prompts longer than cfg.max_prompt_len keep
  their last tokens); pass rows / seq_len for buffers of other shapes.
  """
  rows = cfg.rows if rows is None else rows
  t = cfg.seq_len if seq_len is None else seq_len
  max_prompt = cfg.max_prompt_len if seq_len is None else t
  tokens = np.full((rows, t), pad_id, np.int32)
  seg = np.zeros((rows, t), np.int32)
  loss_mask = np.zeros((rows, t), np.float32)
  sampler_logp = np.zeros((rows, t), np.float32)
  truncated = np.zeros((rows,), bool)
  adv = np.zeros((rows,), np.float32)
  r = 0
  for g in groups:
    adv_g = np.asarray(grpo.group_advantages(np.asarray(g.rewards)[None],
                                             normalize_std=cfg.normalize_std))[0]
    p = list(g.prompt_ids)[-max_prompt:]
    for ci, c in enumerate(g.completions):
      ids = list(c.token_ids)[:t - len(p)]
      n = len(p) + len(ids)
      tokens[r, :n] = p + ids
      seg[r, :n] = 1
      loss_mask[r, len(p):n] = 1
      if c.logprobs is not None:
        sampler_logp[r, len(p):n] = c.logprobs[:len(ids)]
      truncated[r] = c.finish_reason == "length"
      adv[r] = adv_g[ci]
      r += 1
  return dict(tokens_bt=tokens, segment_bt=seg, loss_mask_bt=loss_mask, advantages_b=adv,
              sampler_logp_bt=sampler_logp, truncated_b=truncated)


def rollout_metrics(sampled: Sequence[Group], kept: Sequence[Group], rounds: int,
                    cfg: RLConfig) -> dict[str, float]:
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


def rl_step(state, update_fn, sampler: Sampler, draw: Callable[[int], list[int]],
            prompt_ids, answers, score_fn: ScoreFn, cfg: RLConfig, step: int,
            to_batch: Callable[[dict], Any], pad_id: int = 0):
  """One GRPO step. Returns (new state, metrics).

  draw(k): the next k example indices of the data stream. to_batch: numpy
  dict -> learner.TrainBatch placed on the mesh (per-process rows when
  multi-host). Pushes the new weights to the sampler at version step + 1.
  """
  t0 = time.perf_counter()
  timing = {}
  clock = [time.perf_counter()]

  def lap(name):
    now = time.perf_counter()
    timing[f"time_{name}"] = now - clock[0]
    clock[0] = now

  score_time = [0.0]

  def timed_score(texts, golds):
    t = time.perf_counter()
    out = score_fn(texts, golds)
    score_time[0] += time.perf_counter() - t
    return out

  kept, sampled, rounds = gather_groups(sampler, draw, prompt_ids, answers, timed_score, cfg, step)
  lap("rollout")
  timing["time_score"] = score_time[0]
  timing["time_sample"] = timing.pop("time_rollout") - score_time[0]
  arrays = build_batch(kept, cfg, pad_id)
  state, learner_metrics = update_fn(state, to_batch(arrays))
  learner_metrics = {k: float(v) for k, v in learner_metrics.items()}
  lap("update")
  sampler.update_weights(state.params, version=step + 1)
  lap("sync")
  out = rollout_metrics(sampled, kept, rounds, cfg)
  out.update(learner_metrics)
  out.update(timing)
  total = time.perf_counter() - t0
  gen_tokens = sum(len(c.token_ids) for g in sampled for c in g.completions)
  out["time_step"] = total
  out["tokens_per_s"] = gen_tokens / total
  return state, out
