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

from rlvr import grpo, learner, metrics as metrics_lib, shaping
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
  repetition_penalty: float = 1.0   # vLLM / HF semantics; 1 = off
  dynamic_sampling: bool = True     # keep only groups with 0 < acc < 1
  max_extra_rounds: int = 3         # bounded over-sampling rounds per step
  oversample: float = 2.0           # extra prompts per missing group in later rounds
  normalize_std: bool = True        # False: Dr.GRPO advantages
  adv_std_ddof: int = 1             # group std as verl / TRL take it (torch.std); 0: population
  ppo_mini_batch_size: int = 0      # groups (prompts) per optimizer step, as verl's
                                    # ppo_mini_batch_size; 0: the whole buffer in one step
  ppo_epochs: int = 1               # passes over a buffer's mini-batches
  old_logp: str = "learner"         # old policy of a multi-step update: "learner" (recomputed
                                    # once per rollout batch, as verl) or "sampler" (its logprobs)
  pack: bool = False                # the update packs several sequences per row (verl's
                                    # remove-padding, TRL's padding-free)
  pack_len: int = 0                 # packed row length (0: seq_len, the longest sequence)
  pack_min_rows: int = 8            # packed row counts: powers of two >= this (a multiple of
                                    # data-parallel devices x learner micro-batch rows)
  seed: int = 0

  def __post_init__(self):
    for name in ("prompts_per_step", "group_size", "max_prompt_len", "max_response_len",
                 "ppo_epochs"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if self.group_size < 2:
      raise ValueError(f"group_size: GRPO needs >= 2 responses per prompt, got {self.group_size}")
    if self.max_extra_rounds < 0 or self.oversample < 1:
      raise ValueError("max_extra_rounds must be >= 0 and oversample >= 1")
    if self.adv_std_ddof not in (0, 1):
      raise ValueError(f"adv_std_ddof: expected 0 or 1, got {self.adv_std_ddof}")
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")
    if self.ppo_mini_batch_size < 0:
      raise ValueError(f"ppo_mini_batch_size: must be >= 0 (0 = whole buffer), "
                       f"got {self.ppo_mini_batch_size}")
    if self.old_logp not in ("learner", "sampler"):
      raise ValueError(f"old_logp: unknown {self.old_logp!r}; expected learner|sampler")
    if self.pack_len < 0 or self.pack_min_rows < 1:
      raise ValueError(f"pack_len / pack_min_rows: must be >= 0 / >= 1, got {self.pack_len} / "
                       f"{self.pack_min_rows}")

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
    return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p,
                          top_k=self.top_k, repetition_penalty=self.repetition_penalty,
                          max_tokens=self.max_response_len, seed=seed)


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
    """Some but not all responses correct (DAPO's dynamic-sampling filter: by accuracy, so
    shaping terms such as the overlong penalty do not make a solved group 'mixed')."""
    return bool(self.correct.any() and not self.correct.all())


ScoreFn = Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray]]
GenerateFn = Callable[[list[Sequence[int]], SamplingParams], list[list[Completion]]]


def rollout(generate: GenerateFn, score_fn: ScoreFn, prompts: Sequence[Prompt],
            sp: SamplingParams, shape: Callable | None = None) -> list[Group]:
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
  return (seed * 1_000_003 + step * 1009 + round_ * 7919) % (2 ** 31)


class StepEnv:
  """What a method may use inside one step: sampler, scorer, encoders, the RL config.

  `generate` and `score` go through here so the step tail can time them and
  count generated tokens; `complete` is the text-in / text-out call that
  synthesis functions take. Rollouts add the `shaping` terms to the
  verifier's reward (`well_formed(text)` decides the format bonus).
  `answer_of` is a task's exact answer of a problem text (procedural tasks
  only): diagnostics, never a training signal.
  """

  def __init__(self, sampler: Sampler, score_fn: ScoreFn, *, rl: RLConfig, pad_id: int,
               encode: Callable[[str], list[int]], encode_task: Callable[[str], list[int]],
               answer_of: Callable[[str], str | None] | None = None,
               shaping_cfg: shaping.ShapingConfig | None = None,
               well_formed: Callable[[str], bool] | None = None):
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
    return rollout(self.generate, self.score, prompts, sp,
                   shape=self._shape if self.shaping is not None else None)

  def _shape(self, completions, rewards):
    wf = ([self.well_formed(c.text) for c in completions] if self.shaping.format_bonus
          else [False] * len(completions))
    shaped, terms = shaping.shape(rewards, [len(c.token_ids) for c in completions], wf,
                                  self.shaping, self.rl.max_response_len)
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
    if not groups:
      continue
    sampled += groups
    kept += [g for g in groups if g.mixed or not cfg.dynamic_sampling][:missing]
    if len(kept) >= need or not cfg.dynamic_sampling:
      return kept, sampled, round_ + 1
  if not sampled:
    raise NoSignalError(f"step {step}: every drawn prompt is longer than max_prompt_len "
                        f"({cfg.max_prompt_len} tokens); raise rl.loop.max_prompt_len")
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
                seq_len: int | None = None, min_rows: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded [rows, seq_len] arrays: prompt, then completion (in the loss), then pad.

  Rows beyond the groups are padding (no loss tokens). Advantages are computed
  within each group (`grpo.group_advantages`); groups may differ in size.
  Default shape: cfg.rows (or `min_rows`) x cfg.seq_len, grown to the next power
  of two when the groups need more (a larger buffer, a longer prompt), so shapes
  stay few. With `cfg.pack` the sequences are packed side by side into rows of
  max(cfg.pack_len, that seq_len) tokens (`learner.first_fit`), as few rows as they
  need rounded up to a power of two >= cfg.pack_min_rows, with per-token
  advantages and truncation flags.
  """
  seqs = [(g.prompt.ids, c.token_ids, c.logprobs) for g in groups for c in g.completions]
  lengths = [len(p) + len(c) for p, c, _ in seqs]
  adv = np.zeros((len(seqs),), np.float32)
  r = 0
  for g in groups:
    adv_g = np.asarray(grpo.group_advantages(np.asarray(g.rewards)[None],
                                             normalize_std=cfg.normalize_std,
                                             ddof=cfg.adv_std_ddof))[0]
    adv[r:r + len(adv_g)] = adv_g
    r += len(adv_g)
  truncated = np.array([c.finish_reason == "length" for g in groups for c in g.completions],
                       bool)
  seq_len = bucket(max(lengths, default=0), cfg.seq_len, 16) if seq_len is None else seq_len
  if cfg.pack:
    seq_len = max(seq_len, cfg.pack_len)
    bins = learner.first_fit(lengths, seq_len)
    rows = bucket(len(bins), cfg.pack_min_rows) if rows is None else rows
    arrays = learner.pack_rows(seqs, rows, seq_len, pad_id, bins=bins)
    index = arrays.pop("sequence_bt")
    real = index >= 0
    return dict(arrays, advantages_b=np.where(real, adv[index], 0.0).astype(np.float32),
                truncated_b=real & truncated[index])
  rows = bucket(len(seqs), min_rows or cfg.rows) if rows is None else rows
  arrays = learner.pack_rows(seqs, rows, seq_len, pad_id)
  return dict(arrays, advantages_b=np.pad(adv, (0, rows - len(seqs))),
              truncated_b=np.pad(truncated, (0, rows - len(seqs))))


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


def mini_batches(groups: Sequence[Group], cfg: RLConfig, rng: np.random.Generator):
  """Whole groups, `ppo_mini_batch_size` per mini-batch, in a seeded shuffled order.

  One mini-batch (size 0, or at least as many groups as the buffer) keeps the
  buffer's order.
  """
  k = cfg.ppo_mini_batch_size
  if k <= 0 or len(groups) <= k:
    return [list(groups)]
  order = rng.permutation(len(groups))
  return [[groups[i] for i in order[j:j + k]] for j in range(0, len(groups), k)]


def _mean_over_steps(steps: Sequence[dict]) -> dict[str, float]:
  """Learner metrics of several optimizer steps as one row: means, ratio extremes, token sum."""
  out = {k: float(np.mean([float(m[k]) for m in steps])) for k in steps[0]}
  out["ratio_max"] = max(float(m["ratio_max"]) for m in steps)
  out["ratio_min"] = min(float(m["ratio_min"]) for m in steps)
  out["tokens"] = sum(float(m["tokens"]) for m in steps)
  out["lr"] = float(steps[-1]["lr"])
  return out


def multi_step_update(state, update_fn, logp_fn, batches: Sequence, epochs: int = 1,
                      old_logp: str = "learner", rng: np.random.Generator | None = None):
  """Several optimizer steps on one rollout's mini-batches (verl's PPO update).

  Old logprobs are fixed once, before the first step: recomputed by the learner
  (`logp_fn(params, batch)`) or taken from the sampler. Each mini-batch is one
  optimizer step with its own loss normaliser; epochs after the first visit the
  mini-batches in a new seeded order. Returns (state, per-step learner metrics,
  KL(first policy || last policy) over the rollout's completion tokens).
  """
  import jax.numpy as jnp
  rng = rng or np.random.default_rng(0)
  if old_logp == "learner":
    batches = [b.replace(old_logp_bt=logp_fn(state.params, b)) for b in batches]
  else:
    batches = [b.replace(old_logp_bt=b.sampler_logp_bt) for b in batches]
  steps = []
  for epoch in range(epochs):
    order = range(len(batches)) if epoch == 0 else rng.permutation(len(batches))
    for i in order:
      state, m = update_fn(state, batches[i])
      steps.append(m)
  kl_sum = tokens = 0.0
  for b in batches:   # k3 estimate of KL(pi_first || pi_last) on samples of pi_first
    d = logp_fn(state.params, b) - b.old_logp_bt
    mask = (b.loss_mask_bt * b.segment_bt) > 0
    kl_sum += float(jnp.sum(jnp.where(mask, jnp.exp(d) - 1.0 - d, 0.0)))
    tokens += float(jnp.sum(mask))
  return state, steps, kl_sum / max(tokens, 1.0)


def update_on_buffer(state, update_fn, logp_fn, groups: Sequence[Group], cfg: RLConfig,
                     pad_id: int, to_batch: Callable[[dict], Any], step: int):
  """The buffer's optimizer step(s). One mini-batch and one epoch: exactly one update with
  the current policy as the old one (ratio 1); otherwise `multi_step_update`."""
  rng = np.random.default_rng((cfg.seed, step, 17))
  chunks = mini_batches(groups, cfg, rng)
  if len(chunks) == 1 and cfg.ppo_epochs == 1:
    state, m = update_fn(state, to_batch(build_batch(chunks[0], cfg, pad_id)))
    return state, dict({k: float(v) for k, v in m.items()}, optimizer_steps=1)
  if logp_fn is None:
    raise ValueError("ppo_mini_batch_size / ppo_epochs: several optimizer steps per rollout need "
                     "logp_fn (learner.make_logprob_fn) to fix the old logprobs")
  batches = [to_batch(build_batch(c, cfg, pad_id, min_rows=cfg.mini_batch_rows))
             for c in chunks]
  state, steps, kl = multi_step_update(state, update_fn, logp_fn, batches, cfg.ppo_epochs,
                                       cfg.old_logp, rng)
  return state, dict(_mean_over_steps(steps), optimizer_steps=len(steps), kl_first_last=kl)


def rl_step(state, update_fn, method, env: StepEnv, step: int, to_batch: Callable[[dict], Any],
            logp_fn=None):
  """One RL step of any method. Returns (new state, metrics).

  method.buffer(env, step) -> (groups, metrics) builds the update's data;
  to_batch: numpy dict -> learner.TrainBatch placed on the mesh (per-process
  rows when multi-host); logp_fn: the learner's (params, batch) -> logp, needed
  when a buffer makes several optimizer steps (rl.ppo_mini_batch_size, ppo_epochs).
  The sampler gets the new weights at version step + 1, also when the buffer is
  empty and the update is skipped. A method with `resets_optimizer(step) -> True`
  gets fresh optimizer moments before that step's update (QbQ: every round).
  """
  t0 = time.perf_counter()
  env.reset()
  groups, m = method.buffer(env, step)
  m = dict(m)
  resets = getattr(method, "resets_optimizer", None)
  if resets is not None and resets(step):
    state = learner.reset_optimizer(state)
    m["optimizer_reset"] = 1
  t_buffer = time.perf_counter()
  if groups:
    state, learner_metrics = update_on_buffer(state, update_fn, logp_fn, groups, env.rl,
                                              env.pad_id, to_batch, step)
    m.update(learner_metrics)
  t_update = time.perf_counter()
  env.sampler.update_weights(state.params, version=step + 1)
  end = time.perf_counter()
  m.update({
      "skipped_update": int(not groups),
      "prompts_too_long": env.prompts_too_long,
      **{k: v / max(env.shaped, 1) for k, v in env.shaping_sums.items()},
      "time_sample": env.time_sample, "time_score": env.time_score,
      "time_buffer": t_buffer - t0, "time_update": t_update - t_buffer,
      "time_sync": end - t_update, "time_step": end - t0,
      "tokens_per_s": env.generated_tokens / (end - t0),
  })
  return state, m
