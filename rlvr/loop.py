"""The step every RL method shares: rollouts, dynamic sampling, metrics, update, weight sync.

A method (`rlvr/methods/`) only builds the buffer of scored groups for one
update; `rl_step` does the rest the same way for all of them: the rollout
metrics of the groups the method reports (`StepEnv.report_rollouts`), the update
on the groups packed into bucketed shapes (`rlvr.ppo`, `rlvr.packing`), one
weight push to the sampler, and the phases' timings. Everything outside the
update is plain Python around the Sampler and the scorer, reached through a
`StepEnv`.

`Rollouts` decides when a step's buffer is built: at the start of the step
(`max_staleness` 0, strict alternation), or one step ahead, from the weights the
sampler holds while the previous update runs (`max_staleness` 1, one-step
off-policy), in a worker thread when the sampler runs apart from the learner.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from rlvr import grpo, learner, ppo, shaping
from rlvr import metrics as metrics_lib
from rlvr.sampling.types import Completion, Sampler, SamplingParams


class NoSignalError(RuntimeError):
  """Every sampled group had zero reward variance for all allowed rounds."""


def no_signal_fix(solve_all: float, solve_none: float) -> str:
  """What to change when no group has mixed rewards, from the fractions of groups all right
  and all wrong."""
  if solve_none >= solve_all:  # an untrained (random) policy gets everything wrong
    return (
      "the problems are too hard for the policy: warm-start it with SFT (sft.steps > 0, "
      "on worked solutions) or start from a trained checkpoint (model.path)"
    )
  return "the problems are too easy for the policy: give harder ones"


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
  max_staleness: int = 0  # 0: each step samples from the weights it updates; 1: the
  # buffer of step t+1 is sampled from the weights before update t, while it runs
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
    if self.max_staleness not in (0, 1):
      raise ValueError(
        f"max_staleness: expected 0 or 1, got {self.max_staleness} (one set of sampler "
        "weights holds one version; staleness 2 would need two)"
      )
    if self.max_staleness and self.old_logp != "learner":
      raise ValueError(
        "old_logp: 'sampler' with max_staleness=1 would clip against weights one update "
        "behind the learner's; use old_logp='learner' (TIS still uses the sampler's)"
      )
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
  tags: dict[str, str] = dataclasses.field(default_factory=dict)  # a method's labels of the
  # group (SvS: data_type), written with its responses to the samples log (`samples_log`)

  @property
  def mixed(self) -> bool:
    """Some but not all responses correct (DAPO's dynamic-sampling filter: by accuracy, so
    shaping terms such as the overlong penalty do not make a solved group 'mixed')."""
    return bool(self.correct.any() and not self.correct.all())


# (texts, golds, prompts=None) -> (rewards, correct): prompts, the problem statement of each text
ScoreFn = Callable[..., tuple[np.ndarray, np.ndarray]]
GenerateFn = Callable[[list[Sequence[int]], SamplingParams], list[list[Completion]]]


def rollout(
  generate: GenerateFn,
  score_fn: ScoreFn,
  prompts: Sequence[Prompt],
  sp: SamplingParams,
  shape: Callable | None = None,
) -> list[Group]:
  """Samples sp.n responses per prompt (one generate call) and scores them.

  The scorer gets each response's problem statement (`Prompt.text`) as `prompts`.
  shape(completions, rewards) -> rewards adds shaping terms to the verifier's.
  """
  outs = generate([list(p.ids) for p in prompts], sp)
  texts = [c.text for group in outs for c in group]
  golds = [p.answer for p in prompts for _ in range(sp.n)]
  problems = [p.text for p in prompts for _ in range(sp.n)]
  rewards, correct = score_fn(texts, golds, prompts=problems)
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
    self.verdicts: dict[str, int] = {}  # a verifier's `counts` (responses per verdict), summed
    self.reported: tuple[list[Group], list[Group], int] | None = None

  def fork(self) -> "StepEnv":
    """The same sampler, scorer and encoders with counters of its own: one per buffer,
    so a buffer built ahead in a worker thread counts only its own calls."""
    env = object.__new__(StepEnv)
    env.__dict__.update(self.__dict__)
    env.reset()
    return env

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

  def score(self, texts: list[str], golds: list[str], prompts: list[str] | None = None):
    t = time.perf_counter()
    out = self._score_fn(texts, golds, prompts=prompts)
    self.time_score += time.perf_counter() - t
    for k, v in getattr(out, "counts", {}).items():
      self.verdicts[k] = self.verdicts.get(k, 0) + v
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
      f"solve_none {stats['solve_none']:.0%}); "
      f"{no_signal_fix(stats['solve_all'], stats['solve_none'])}; "
      "or raise rl.loop.max_extra_rounds"
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


@dataclasses.dataclass
class Buffer:
  """The data of one step's update, with the metrics of building it (`build_buffer`).

  version: the sampler's weight version when the build began; started / ended:
  `time.perf_counter()` stamps of the build; generated_tokens: tokens its generate calls
  produced (a resumed method may reuse stored work, so this is a timing, not a metric);
  sampled: the groups its rollout metrics describe (`StepEnv.report_rollouts`).
  """

  step: int
  groups: list[Group]
  metrics: dict[str, Any]
  version: int
  started: float = 0.0
  ended: float = 0.0
  generated_tokens: int = 0
  sampled: list[Group] = dataclasses.field(default_factory=list)


def build_buffer(method, env: StepEnv, step: int, version: int) -> Buffer:
  """method.buffer(env, step) on a fork of env, with its rollout metrics and counters."""
  env = env.fork()
  t0 = time.perf_counter()
  groups, m = method.buffer(env, step)
  m = dict(m)
  if env.reported is not None:
    m.update(rollout_metrics(*env.reported, env.rl))
  m.update(
    {
      "prompts_too_long": env.prompts_too_long,
      **{k: v / max(env.shaped, 1) for k, v in env.shaping_sums.items()},
      **{f"verdict_{k}": v for k, v in env.verdicts.items()},
      "time_sample": env.time_sample,
      "time_score": env.time_score,
    }
  )
  t1 = time.perf_counter()
  m["time_buffer"] = t1 - t0
  sampled = list(env.reported[0]) if env.reported is not None else []
  return Buffer(step, list(groups), m, version, t0, t1, env.generated_tokens, sampled)


def staleness_metrics(buf: Buffer) -> dict[str, float]:
  """Update step minus the weight version each sample was drawn from (the sampler's tag
  when it gives one, else the version it held when the build began)."""
  ages = [
    buf.step - (c.weight_version if c.weight_version is not None else buf.version)
    for g in buf.groups
    for c in g.completions
  ]
  if not ages:
    return {}
  return {"staleness_mean": float(np.mean(ages)), "staleness_max": int(max(ages))}


class Rollouts:
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

  def __init__(self, method, env: StepEnv, *, overlap: bool = True, last_step: int | None = None):
    self.method, self.env = method, env
    self.ahead = env.rl.max_staleness == 1
    self.overlap, self.last_step = overlap, last_step
    self.pending: Buffer | None = None
    self.built: list[Buffer] = []  # the builds of the current step, for its timings
    self._future: concurrent.futures.Future | None = None
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "rollouts") if overlap else None

  def take(self, step: int) -> Buffer:
    """Step `step`'s buffer: the one built ahead, else built now."""
    if self.pending is not None and self.pending.step == step:
      buf, self.pending, self.built = self.pending, None, []
      return buf
    self.pending = None
    buf = build_buffer(self.method, self.env, step, version=step)
    self.built = [buf]
    return buf

  def start_ahead(self, step: int) -> None:
    """Begins the next step's buffer from the weights the sampler holds now (version step)."""
    nxt = step + 1
    if not self.ahead or (self.last_step is not None and nxt >= self.last_step):
      return
    if self._pool is not None:
      self._future = self._pool.submit(build_buffer, self.method, self.env, nxt, step)
    else:
      self.pending = build_buffer(self.method, self.env, nxt, step)
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
  env.sampler.update_weights(state.params, version=step + 1)
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
