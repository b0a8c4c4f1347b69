"""QbQ: rounds of score -> seed -> vary -> score -> SelectRL -> GRPO (docs/methods.md#qbq).

Round t of `rounds`, each `steps_per_round` RL steps (paper: 20 x 150):
  seeds    S_0 = the seed band of pi_0 over the training pool (`initial_seeds` of them
           drawn); S_t = the problems of R_{t-1} whose count re-scored under pi_t is
           in the band (Eq. 3);
  variants the teacher applies 3 operators per seed (`synthesis.qbq`; the teacher,
           `qbq_teachers`, is the policy itself, any OpenAI-compatible server, or for
           the arithmetic task the procedural one of `rlvr.data.tasks.variants`);
  scored   n = correct of k samples of pi_t per accepted variant;
  selected R_t = SelectRL(V_t) (Algorithm 2);
  GRPO     one pass over R_t, `rl.loop.prompts_per_step` problems per step, a fresh
           optimizer at the start of the round; steps past the end of the pass
           (|R_t| < N) are skipped updates, so rounds stay aligned with steps.
Every stage writes its artifact under `<workdir>/qbq/round_XX/` (`qbq_store`: seeds,
variants with their rejection reasons, scores, selection, rescored, round.json with the
yield, the count bands and the Vendi score in round.jsonl); a resumed run loads the artifacts
that exist and computes only the missing stages, so a kill between stages
loses nothing. Held-out scores never steer (eval.every = steps_per_round
prints them per round).

Schedules (ablations): "curriculum" (the method); "shuffled" (QbQ without the
curriculum: the selections of the curriculum run at `replay_from`, all rounds
shuffled into one pass, from pi_0); "static" (real-plus-synthetic augmentation:
variants of every pool problem made once, trained with the originals).
Rules the paper leaves open: an empty S_t (no problem in the band) reuses
S_{t-1}; S_0 is drawn without replacement in the pool's seeded order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr import rollout
from rlvr.common import settings
from rlvr.common.panel import Panel
from rlvr.methods.base import Group, Method, MethodSettings, Prompt, PromptPool, Rollout
from rlvr.methods.qbq_store import RoundStore, as_variant
from rlvr.methods.qbq_teachers import Complete, llm_variants, procedural_variants, server_teacher
from rlvr.sampling.types import SamplingParams
from synthesis import diversity, qbq

SCHEDULES = ("curriculum", "shuffled", "static")


@dataclasses.dataclass(frozen=True)
class QbQConfig:
  rounds: int = 20  # T, fixed in advance
  steps_per_round: int = 150  # one pass over N = 300 problems at 2 per step
  k: int = 16  # samples per solve count
  seed_band: str = "mostly"  # "mostly" (8..15 of 16), "sometimes", "mixed"
  initial_seeds: int = 133  # |S_0| drawn from the band (0: the whole band)
  select_n: int = 300  # N of SelectRL
  operators_per_seed: int = 3
  schedule: str = "curriculum"  # "curriculum" | "shuffled" | "static"
  replay_from: str = ""  # shuffled: workdir of a curriculum run
  teacher: str = "policy"  # "policy", "procedural" (arithmetic), or the URL
  # of an OpenAI-compatible server
  teacher_model: str = "policy"  # served model name (URL teacher)
  teacher_temperature: float = 1.0
  teacher_top_p: float = 1.0
  teacher_max_tokens: int = 2048
  integer_answers: bool = False  # variants must have integer answers (AIME)
  score_temperature: float = 0.7  # solve counts (paper Table 3)
  score_top_p: float = 0.8
  score_top_k: int = 20
  score_repetition_penalty: float = 1.05
  score_max_tokens: int = 3072

  def __post_init__(self):
    for name in ("rounds", "steps_per_round", "k", "select_n", "operators_per_seed"):
      if getattr(self, name) < 1:
        raise ValueError(f"qbq.{name}: must be >= 1, got {getattr(self, name)}")
    if self.seed_band not in qbq.SEED_BANDS:
      raise ValueError(f"qbq.seed_band: unknown {self.seed_band!r}; expected {qbq.SEED_BANDS}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"qbq.schedule: unknown {self.schedule!r}; expected {SCHEDULES}")
    if self.schedule == "shuffled" and not self.replay_from:
      raise ValueError(
        "qbq.replay_from: the shuffled schedule replays a curriculum run's "
        "selections; set it to that run's workdir"
      )
    if not 1 <= self.operators_per_seed <= len(qbq.OPERATORS):
      raise ValueError(
        f"qbq.operators_per_seed: 1..{len(qbq.OPERATORS)}, got {self.operators_per_seed}"
      )


class QbQ(Method):
  """The round pipeline over the step seam; state = round prepared + position in its pass."""

  name = "qbq"
  plot_keys: tuple[str | Panel, ...] = (
    "qbq_round",
    Panel(
      "Problems per QbQ round",
      "problems",
      (
        ("qbq_seeds", "seeds S_t"),
        ("qbq_accepted", "variants accepted"),
        ("qbq_eligible", "variants with 1..k-1 of k correct"),
        ("qbq_selected", "selected for RL, R_t"),
      ),
    ),
    "qbq_vendi",
    "accuracy",
    Panel(
      "Training groups all or none correct",
      "fraction of groups",
      (("solve_all", "all correct (too easy)"), ("solve_none", "none correct (too hard)")),
    ),
  )
  progress_keys: Mapping[str, str] = {"round": "qbq_round", "sel": "qbq_selected"}
  mark_key = "qbq_round_start"

  def __init__(
    self,
    cfg: QbQConfig,
    train: Sequence[Prompt],
    workdir: str,
    seed: int,
    complete: Complete | None = None,
  ):
    self.cfg, self.train, self.seed = cfg, list(train), seed
    self.store = RoundStore(workdir)
    self.external = complete  # a URL teacher; None: policy or procedural
    self.round = -1  # the round whose pass is prepared
    self.pos = 0  # problems of the pass used so far
    self.problems: list[Prompt] = []  # the pass (or the static pool)
    self.pool: PromptPool | None = None
    self._pool_state: Mapping[str, Any] | None = None  # a restored static pool's position
    self.round_metrics: dict[str, float] = {}

  # ---------------------------------------------------------------- stages
  def _counts(self, ctx: Rollout, items: Sequence[qbq.Variant], t: int, salt: int) -> list[dict]:
    """Solve counts n of k scoring samples; prompts over max_prompt_len get n = None (the
    rollout drops them and counts them in prompts_too_long)."""
    c = self.cfg
    prompts = [ctx.prompt(v.problem, v.answer, f"qbq-r{t}") for v in items]
    sp = SamplingParams(
      n=c.k,
      temperature=c.score_temperature,
      top_p=c.score_top_p,
      top_k=c.score_top_k,
      repetition_penalty=c.score_repetition_penalty,
      max_tokens=c.score_max_tokens,
      seed=rollout.step_seed(self.seed, t, salt),
    )
    # Correctness only: no shaping terms, so a step's shaping metrics describe its update's
    # rollouts whether or not this stage ran in it (a resumed run may load it instead).
    # A group holds the very Prompt object it was sampled for.
    scored = {id(g.prompt): g for g in ctx.groups(prompts, sp, shaped=False)}
    return [
      dict(dataclasses.asdict(v), n=int(scored[id(p)].correct.sum()) if id(p) in scored else None)
      for v, p in zip(items, prompts)
    ]

  def _teach(self, ctx: Rollout, seeds: Sequence[qbq.Variant], t: int) -> list[dict]:
    c = self.cfg
    if c.teacher == "procedural":
      rows = procedural_variants(seeds, c.operators_per_seed, salt=str(t))
    else:
      complete = self.external or self._policy_complete(ctx, t)
      rows = llm_variants(seeds, complete, c.operators_per_seed, c.integer_answers)
    seen = [s.problem for s in seeds]
    by_parent: dict[str, list[dict]] = {}
    for r in rows:
      if r["reason"] == "accepted":
        by_parent.setdefault(r["parent_id"], []).append(r)
    parents = {s.id: s for s in seeds}
    for pid, group in by_parent.items():
      reasons = qbq.reject_variants(
        parents[pid].answer, [(r["problem"], r["answer"]) for r in group], seen=seen
      )
      for r, why in zip(group, reasons):
        r["reason"] = why
        if why == "accepted":
          seen.append(r["problem"])
    return rows

  def _policy_complete(self, ctx: Rollout, t: int) -> Complete:
    c = self.cfg
    sp = SamplingParams(
      n=1,
      temperature=c.teacher_temperature,
      top_p=c.teacher_top_p,
      max_tokens=c.teacher_max_tokens,
      seed=rollout.step_seed(self.seed, t, 99),
    )
    return lambda prompts: [g[0].text for g in ctx.complete(prompts, sp)]

  def _pool_variants(self) -> list[qbq.Variant]:
    """The training pool as lineage roots "pool-<i>"."""
    return [qbq.Variant(f"pool-{i}", "", "", p.text, p.answer) for i, p in enumerate(self.train)]

  def _pool_seeds(self, ctx: Rollout) -> list[qbq.Variant]:
    """S_0: the band of pi_0 over the training pool, `initial_seeds` drawn in a seeded order."""
    scored = self.store.stage(
      0, "pool_scores.jsonl", lambda: self._counts(ctx, self._pool_variants(), 0, 1)
    )
    band = [
      as_variant(r)
      for r in scored
      if r["n"] is not None and qbq.in_band(r["n"], self.cfg.k, self.cfg.seed_band)
    ]
    order = np.random.default_rng((self.seed, 0, 5)).permutation(len(band))
    take = self.cfg.initial_seeds or len(band)
    return [band[i] for i in sorted(order[:take])]

  def _next_seeds(self, ctx: Rollout, t: int) -> list[dict]:
    if t == 0:
      return [dataclasses.asdict(s) for s in self._pool_seeds(ctx)]
    selected = [as_variant(r) for r in self.store.read(t - 1, "selection.jsonl")]
    rescored = self.store.stage(t - 1, "rescored.jsonl", lambda: self._counts(ctx, selected, t, 2))
    counts = {r["id"]: r["n"] for r in rescored if r["n"] is not None}
    seeds = qbq.next_seeds(
      [v for v in selected if v.id in counts], counts, self.cfg.k, self.cfg.seed_band
    )
    if not seeds:  # nothing in the band: the previous seeds again (stated rule)
      return self.store.read(t - 1, "seeds.jsonl")
    return [dataclasses.asdict(s) for s in seeds]

  def _prepare_round(self, ctx: Rollout, t: int) -> list[Prompt]:
    """Runs (or reloads) the stages of round t; returns R_t as prompts."""
    c = self.cfg
    seeds = [
      as_variant(r) for r in self.store.stage(t, "seeds.jsonl", lambda: self._next_seeds(ctx, t))
    ]
    made = self.store.stage(t, "variants.jsonl", lambda: self._teach(ctx, seeds, t))
    accepted = [as_variant(r) for r in made if r["reason"] == "accepted"]
    scored = self.store.stage(t, "scored.jsonl", lambda: self._counts(ctx, accepted, t, 3))
    usable = [as_variant(r) for r in scored if r["n"] is not None]
    selection = self.store.stage(
      t,
      "selection.jsonl",
      lambda: [dataclasses.asdict(v) for v in qbq.select_rl(usable, c.select_n, c.k)],
    )
    reasons: dict[str, int] = {}
    for r in made:
      reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    bands = {b: sum(qbq.band(v.n, c.k) == b for v in usable) for b in qbq.BANDS}
    texts = [v.problem for v in accepted]
    summary = dict(
      round=t,
      seeds=len(seeds),
      variants=len(made),
      accepted=len(accepted),
      too_long=len(scored) - len(usable),
      reasons=reasons,
      bands=bands,
      eligible=sum(1 <= v.n <= c.k - 1 for v in usable),
      selected=len(selection),
      vendi=diversity.pool_vendi(texts, diversity.hashed_ngrams) if texts else 0.0,
    )
    self.store.write(t, "round.jsonl", [summary])
    self.round_metrics = {
      "qbq_seeds": len(seeds),
      "qbq_accepted": len(accepted),
      "qbq_eligible": summary["eligible"],
      "qbq_selected": len(selection),
      "qbq_vendi": summary["vendi"],
      **{f"qbq_band_{b}": n for b, n in bands.items()},
    }
    order = np.random.default_rng((self.seed, t, 11)).permutation(len(selection))
    return [
      ctx.prompt(selection[i]["problem"], str(selection[i]["answer"]), f"qbq-r{t}") for i in order
    ]

  def _replayed(self, ctx: Rollout) -> list[Prompt]:
    """shuffled: every round's selection of the curriculum run at replay_from, one pass."""
    rows = RoundStore(self.cfg.replay_from).selections()
    if not rows:
      raise ValueError(
        f"qbq.replay_from: no round_*/selection.jsonl under "
        f"{self.cfg.replay_from}/qbq; run the curriculum schedule there first"
      )
    order = np.random.default_rng((self.seed, 13)).permutation(len(rows))
    self.round_metrics = {"qbq_selected": len(rows)}
    return [ctx.prompt(rows[i]["problem"], str(rows[i]["answer"]), "qbq-replay") for i in order]

  def _static_pool(self, ctx: Rollout) -> PromptPool:
    """static: originals plus variants of every pool problem, made once by the teacher."""
    made = self.store.stage(0, "variants.jsonl", lambda: self._teach(ctx, self._pool_variants(), 0))
    extra = [
      ctx.prompt(r["problem"], str(r["answer"]), "qbq-static")
      for r in made
      if r["reason"] == "accepted"
    ]
    self.round_metrics = {"qbq_accepted": len(extra)}
    return PromptPool(self.train + extra, self.seed)

  # ---------------------------------------------------------------- the seam
  def _ensure(self, ctx: Rollout, t: int) -> bool:
    """Prepares what step t's round draws from; True when a new round starts here."""
    if self.cfg.schedule == "static":
      if self.pool is None:
        self.pool = self._static_pool(ctx)
        if self._pool_state is not None:
          self.pool.restore(self._pool_state)
      return False
    target = 0 if self.cfg.schedule == "shuffled" else t
    if self.round == target and self.problems:
      return False
    fresh = self.round != target
    self.problems = (
      self._replayed(ctx) if self.cfg.schedule == "shuffled" else self._prepare_round(ctx, target)
    )
    if fresh:
      self.round, self.pos = target, 0
    return fresh

  def resets_optimizer(self, step: int) -> bool:
    """A fresh optimizer at the start of every round after the first (paper C.2)."""
    return self.cfg.schedule == "curriculum" and step > 0 and step % self.cfg.steps_per_round == 0

  def buffer(self, ctx: Rollout, step: int) -> tuple[list[Group], dict[str, float]]:
    t = step // self.cfg.steps_per_round
    start = self._ensure(ctx, t)
    k = ctx.rl.prompts_per_step
    if self.pool is not None:
      batch = self.pool.draw(k)
    else:
      batch, self.pos = (
        self.problems[self.pos : self.pos + k],
        min(self.pos + k, len(self.problems)),
      )
    m = dict(self.round_metrics, qbq_round=t, qbq_round_start=int(start))
    groups = ctx.groups(batch, ctx.rl.sampling_params(rollout.step_seed(self.seed, step, 0)))
    if groups:
      ctx.report_rollouts(groups, groups, 1)
    return groups, m

  def state(self) -> dict[str, Any]:
    return {
      "round": self.round,
      "pos": self.pos,
      "pool": self.pool.state() if self.pool is not None else None,
    }

  def restore(self, state: Mapping[str, Any]) -> None:
    self.round, self.pos = int(state["round"]), int(state["pos"])
    if state.get("pool") is not None:
      self._pool_state = state["pool"]
    self.problems = []  # reloaded from the artifacts by the next buffer call

  def summary(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    starts = [r for r in rows if r.get("qbq_round_start")]
    return {
      "qbq_rounds": [
        {
          k: r.get(k)
          for k in (
            "qbq_round",
            "qbq_seeds",
            "qbq_accepted",
            "qbq_eligible",
            "qbq_selected",
            "qbq_vendi",
          )
        }
        for r in starts
      ]
    }


def check(cfg) -> QbQConfig:
  c = settings.frozen(QbQConfig, cfg.qbq, prefix="qbq.")
  if not c.teacher:
    raise ValueError(
      "qbq.teacher: empty; set 'policy' (the policy itself), 'procedural' (the "
      "arithmetic task) or the URL of an OpenAI-compatible server"
    )
  if cfg.rl.steps != c.rounds * c.steps_per_round:
    raise ValueError(
      f"rl.steps: {cfg.rl.steps}, but qbq.rounds x qbq.steps_per_round = "
      f"{c.rounds * c.steps_per_round}; set them to agree"
    )
  return c


def make(settings: MethodSettings, train: Sequence[Prompt]) -> QbQ:
  c = settings.section
  complete = None
  if c.teacher not in ("policy", "procedural"):  # the same key as the sampler's servers
    complete = server_teacher(
      c.teacher,
      c.teacher_model,
      api_key=settings.api_key or None,
      temperature=c.teacher_temperature,
      top_p=c.teacher_top_p,
      max_tokens=c.teacher_max_tokens,
    )
  return QbQ(c, train, settings.workdir, settings.seed, complete)
