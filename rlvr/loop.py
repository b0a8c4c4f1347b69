"""The step every RL method shares: rollouts, dynamic sampling, metrics, update, weight sync.

A method (`rlvr/methods/`) only builds the buffer of scored groups for one
update; `rl_step` does the rest the same way for all of them: the rollout
metrics of the groups the method reports (`StepEnv.report_rollouts`), the update
on the groups packed into bucketed shapes (`rlvr.ppo`, `rlvr.packing`), one
weight push to the sampler, and the phases' timings. Everything outside the
update is plain Python around the Sampler and the scorer, reached through a
`StepEnv`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from rlvr import grpo, learner, ppo, shaping
from rlvr import metrics as metrics_lib
from rlvr.sampling.types import Completion, Sampler, SamplingParams


class NoSignalError(RuntimeError):
  """Every sampled group had zero reward variance for all allowed rounds."""


@dataclasses.dataclass(frozen=True)
class RLConfig:
  prompts_per_step: int = 32  # groups in one update
  group_size: int = 8  # G responses per prompt
  max_prompt_len: int = 128
  max_response_len: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  repetition_penalty: float = 1.0  # vLLM / HF semantics; 1 = off
  dynamic_sampling: bool = True  # keep only groups with 0 < acc < 1
  max_extra_rounds: int = 3  # bounded over-sampling rounds per step
  oversample: float = 2.0  # extra prompts per missing group in later rounds
  advantage: str = "grpo"  # "grpo" | "dr_grpo" | "rloo" | "reinforce++" |
  # "reinforce++_baseline" (grpo.ADVANTAGES), or "package.module:function"
  normalize_std: bool = True  # False with advantage "grpo": the "dr_grpo" estimator
  adv_std_ddof: int = 1  # std as verl / TRL take it (torch.std, unbiased); 0: population
  ppo_mini_batch_size: int = 0  # groups (prompts) per optimizer step, as verl's
  # ppo_mini_batch_size; 0: the whole buffer in one step
  ppo_epochs: int = 1  # passes over a buffer's mini-batches
  old_logp: str = "learner"  # old policy of a multi-step update: "learner" (recomputed
  # once per rollout batch, as verl) or "sampler" (its logprobs)
  pack: bool = False  # the update packs several sequences per row (verl's
  # remove-padding, TRL's padding-free)
  pack_len: int = 0  # packed row length (0: seq_len, the longest sequence)
  pack_min_rows: int = 8  # packed row counts: powers of two >= this (a multiple of
  # data-parallel devices x learner micro-batch rows)
  seed: int = 0

  def __post_init__(self):
    for name in (
      "prompts_per_step",
      "group_size",
      "max_prompt_len",
      "max_response_len",
      "ppo_epochs",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if self.group_size < 2:
      raise ValueError(f"group_size: GRPO needs >= 2 responses per prompt, got {self.group_size}")
    if self.max_extra_rounds < 0 or self.oversample < 1:
      raise ValueError("max_extra_rounds must be >= 0 and oversample >= 1")
    if not self.normalize_std and self.advantage not in ("grpo", "dr_grpo"):
      raise ValueError(
        f"normalize_std: False is the 'dr_grpo' estimator; advantage={self.advantage!r} "
        "takes normalize_std=True"
      )
    grpo.advantage_fn(self.advantage)  # a one-line error naming the known estimators
    if self.adv_std_ddof not in (0, 1):
      raise ValueError(f"adv_std_ddof: expected 0 or 1, got {self.adv_std_ddof}")
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")
    if self.ppo_mini_batch_size < 0:
      raise ValueError(
        f"ppo_mini_batch_size: must be >= 0 (0 = whole buffer), got {self.ppo_mini_batch_size}"
      )
    if self.old_logp not in ("learner", "sampler"):
      raise ValueError(f"old_logp: unknown {self.old_logp!r}; expected learner|sampler")
    if self.pack_len < 0 or self.pack_min_rows < 1:
      raise ValueError(
        f"pack_len / pack_min_rows: must be >= 0 / >= 1, got {self.pack_len} / {self.pack_min_rows}"
      )

  @property
  def advantage_estimator(self) -> str:
    """The `grpo.ADVANTAGES` name in effect: `advantage`, or "dr_grpo" for "grpo" with
    normalize_std False."""
    return "dr_grpo" if self.advantage == "grpo" and not self.normalize_std else self.advantage

  @property
  def rows(self) -> int:
    return self.prompts_per_step * self.group_size

  @property
  def mini_batch_rows(self) -> int:
    """Rows of one mini-batch of full groups (the smallest shape a mini-batch is padded to)."""
    return self.ppo_mini_batch_size * self.group_size if self.ppo_mini_batch_size else self.rows

  @property
  def seq_len(self) -> int:
    total = self.max_prompt_len + self.max_response_len
    return -(-total // 16) * 16

  def sampling_params(self, seed: int) -> SamplingParams:
    return SamplingParams(
      n=self.group_size,
      temperature=self.temperature,
      top_p=self.top_p,
      top_k=self.top_k,
      repetition_penalty=self.repetition_penalty,
      max_tokens=self.max_response_len,
      seed=seed,
    )


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
  rewards: np.ndarray  # [G] float
  correct: np.ndarray  # [G] bool

  @property
  def mixed(self) -> bool:
    """Some but not all responses correct (DAPO's dynamic-sampling filter: by accuracy, so
    shaping terms such as the overlong penalty do not make a solved group 'mixed')."""
    return bool(self.correct.any() and not self.correct.all())


ScoreFn = Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray]]
GenerateFn = Callable[[list[Sequence[int]], SamplingParams], list[list[Completion]]]


def rollout(
  generate: GenerateFn,
  score_fn: ScoreFn,
  prompts: Sequence[Prompt],
  sp: SamplingParams,
  shape: Callable | None = None,
) -> list[Group]:
  """Samples sp.n responses per prompt (one generate call) and scores them.

  shape(completions, rewards) -> rewards adds shaping terms to the verifier's.
  """
  outs = generate([list(p.ids) for p in prompts], sp)
  texts = [c.text for group in outs for c in group]
  golds = [p.answer for p in prompts for _ in range(sp.n)]
  rewards, correct = score_fn(texts, golds)
  if shape is not None:
    rewards = shape([c for group in outs for c in group], rewards)
  rewards = np.asarray(rewards, np.float32).reshape(len(prompts), sp.n)
  correct = np.asarray(correct, bool).reshape(len(prompts), sp.n)
  return [Group(p, outs[k], rewards[k], correct[k]) for k, p in enumerate(prompts)]


def step_seed(seed: int, step: int, round_: int) -> int:
  """Sampling seed of one generation round, stable across restarts."""
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2**31)


class StepEnv:
  """What a method may use inside one step: sampler, scorer, encoders, the RL config.

  `generate` and `score` go through here so the step tail can time them and
  count generated tokens; `complete` is the text-in / text-out call that
  synthesis functions take. Rollouts add the `shaping` terms to the
  verifier's reward (`well_formed(text)` decides the format bonus).
  `answer_of` is a task's exact answer of a problem text (procedural tasks
  only): diagnostics, never a training signal.
  """

  def __init__(
    self,
    sampler: Sampler,
    score_fn: ScoreFn,
    *,
    rl: RLConfig,
    pad_id: int,
    encode: Callable[[str], list[int]],
    encode_task: Callable[[str], list[int]],
    answer_of: Callable[[str], str | None] | None = None,
    shaping_cfg: shaping.ShapingConfig | None = None,
    well_formed: Callable[[str], bool] | None = None,
  ):
    self.sampler, self.rl, self.pad_id = sampler, rl, pad_id
    self._score_fn = score_fn
    self.encode, self.encode_task, self.answer_of = encode, encode_task, answer_of
    self.shaping = shaping_cfg if shaping_cfg is not None and shaping_cfg.active else None
    if self.shaping is not None and self.shaping.format_bonus and well_formed is None:
      raise ValueError("shaping.format_bonus needs well_formed(text) to tell a final answer")
    self.well_formed = well_formed
    self.reset()

  def reset(self) -> None:
    self.time_sample = self.time_score = 0.0
    self.generated_tokens = 0
    self.prompts_too_long = 0
    self.shaping_sums: dict[str, float] = {}
    self.shaped = 0
    self.reported: tuple[list[Group], list[Group], int] | None = None

  def report_rollouts(self, sampled: Sequence[Group], kept: Sequence[Group], rounds: int) -> None:
    """Names the rollouts the step's metrics describe (`rollout_metrics`): the groups
    sampled for the update, those kept, and the sampling rounds. `gather_groups`
    reports its own; a method that builds its buffer otherwise reports what it kept
    (the last call counts). A step that reports nothing has no rollout metrics."""
    self.reported = (list(sampled), list(kept), rounds)

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

  def fits(self, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The prompts of at most rl.max_prompt_len tokens; the rest are counted and dropped
    (never cut: the learner must see the prompt the sampler saw)."""
    kept = [p for p in prompts if len(p.ids) <= self.rl.max_prompt_len]
    self.prompts_too_long += len(prompts) - len(kept)
    return kept

  def rollout(self, prompts: Sequence[Prompt], sp: SamplingParams) -> list[Group]:
    """Groups of the prompts that fit (see `fits`), scored."""
    prompts = self.fits(prompts)
    if not prompts:
      return []
    return rollout(
      self.generate,
      self.score,
      prompts,
      sp,
      shape=self._shape if self.shaping is not None else None,
    )

  def _shape(self, completions, rewards):
    wf = (
      [self.well_formed(c.text) for c in completions]
      if self.shaping.format_bonus
      else [False] * len(completions)
    )
    shaped, terms = shaping.shape(
      rewards, [len(c.token_ids) for c in completions], wf, self.shaping, self.rl.max_response_len
    )
    for k, v in terms.items():
      self.shaping_sums[k] = self.shaping_sums.get(k, 0.0) + float(np.sum(v))
    self.shaped += len(completions)
    return shaped

  def complete(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
    """Chat-templated task prompts (no solving instruction) -> sp.n completions each."""
    return self.generate([self.encode_task(p) for p in prompts], sp)

  def prompt(self, text: str, answer: str, source: str) -> Prompt:
    """A solving prompt for a problem text (the run's instruction and chat template)."""
    return Prompt(tuple(self.encode(text)), answer, text, source)


def gather_groups(env: StepEnv, draw: Callable[[int], list[Prompt]], step: int):
  """Rollouts until `prompts_per_step` usable groups (or the round budget) are reached.

  Returns (kept groups, all sampled groups, rounds used), also reported to env
  (`StepEnv.report_rollouts`). Raises NoSignalError when dynamic sampling found no
  mixed group at all within the budget.
  """
  cfg = env.rl
  kept, sampled = [], []
  need = cfg.prompts_per_step
  for round_ in range(cfg.max_extra_rounds + 1):
    missing = need - len(kept)
    count = need if round_ == 0 else int(np.ceil(missing * cfg.oversample))
    groups = env.rollout(draw(count), cfg.sampling_params(step_seed(cfg.seed, step, round_)))
    if not groups:
      continue
    sampled += groups
    kept += [g for g in groups if g.mixed or not cfg.dynamic_sampling][:missing]
    if len(kept) >= need or not cfg.dynamic_sampling:
      env.report_rollouts(sampled, kept, round_ + 1)
      return kept, sampled, round_ + 1
  if not sampled:
    raise NoSignalError(
      f"step {step}: every drawn prompt is longer than max_prompt_len "
      f"({cfg.max_prompt_len} tokens); raise rl.loop.max_prompt_len"
    )
  if not kept:
    stats = metrics_lib.group_stats(np.stack([g.correct for g in sampled]))
    raise NoSignalError(
      f"step {step}: no group with mixed rewards in {len(sampled)} prompts over "
      f"{cfg.max_extra_rounds + 1} rounds (solve_all {stats['solve_all']:.0%}, "
      f"solve_none {stats['solve_none']:.0%}); the data is too easy or too hard for "
      "the policy, or raise max_extra_rounds"
    )
  env.report_rollouts(sampled, kept, cfg.max_extra_rounds + 1)
  return kept, sampled, cfg.max_extra_rounds + 1


def rollout_metrics(
  sampled: Sequence[Group], kept: Sequence[Group], rounds: int, cfg: RLConfig
) -> dict[str, float]:
  """Accuracy, solve rates, lengths and batch fill of one step's rollouts."""
  correct = np.stack([g.correct for g in sampled])
  lengths = np.array([len(c.token_ids) for g in sampled for c in g.completions])
  trunc = np.array([c.finish_reason == "length" for g in sampled for c in g.completions])
  out = metrics_lib.group_stats(correct)
  out.update(
    {
      "reward_mean": float(np.mean([g.rewards.mean() for g in sampled])),
      "response_len_mean": float(lengths.mean()),
      "response_len_max": int(lengths.max()),
      "truncated_frac": float(trunc.mean()),
      "groups_kept": len(kept),
      "batch_fill": len(kept) / cfg.prompts_per_step,
      "prompts_sampled": len(sampled),
      "sample_rounds": rounds,
    }
  )
  return out


def rl_step(
  state, update_fn, method, env: StepEnv, step: int, to_batch: Callable[[dict], Any], logp_fn=None
):
  """One RL step of any method (`rlvr.methods.base.Method`). Returns (new state, metrics).

  method.buffer(env, step) -> (groups, metrics) builds the update's data; the
  rollouts it reports (`StepEnv.report_rollouts`) add `rollout_metrics`.
  to_batch: numpy dict -> learner.TrainBatch placed on the mesh (per-process
  rows when multi-host); logp_fn: the learner's (params, batch) -> logp, needed
  when a buffer makes several optimizer steps (rl.ppo_mini_batch_size, ppo_epochs).
  The sampler gets the new weights at version step + 1, also when the buffer is
  empty and the update is skipped. Where `method.resets_optimizer(step)`, that
  step's update starts from fresh optimizer moments (QbQ: every round).
  """
  t0 = time.perf_counter()
  env.reset()
  groups, m = method.buffer(env, step)
  m = dict(m)
  if env.reported is not None:
    m.update(rollout_metrics(*env.reported, env.rl))
  if method.resets_optimizer(step):
    state = learner.reset_optimizer(state)
    m["optimizer_reset"] = 1
  t_buffer = time.perf_counter()
  if groups:
    state, learner_metrics = ppo.update_on_buffer(
      state, update_fn, logp_fn, groups, env.rl, env.pad_id, to_batch, step
    )
    m.update(learner_metrics)
  t_update = time.perf_counter()
  env.sampler.update_weights(state.params, version=step + 1)
  end = time.perf_counter()
  m.update(
    {
      "skipped_update": int(not groups),
      "prompts_too_long": env.prompts_too_long,
      **{k: v / max(env.shaped, 1) for k, v in env.shaping_sums.items()},
      "time_sample": env.time_sample,
      "time_score": env.time_score,
      "time_buffer": t_buffer - t0,
      "time_update": t_update - t_buffer,
      "time_sync": end - t_update,
      "time_step": end - t0,
      "tokens_per_s": env.generated_tokens / (end - t0),
    }
  )
  return state, m
