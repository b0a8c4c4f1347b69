"""SvS (docs/methods.md#svs): self-play variational problem synthesis inside the RL step.

solve originals (dynamic sampling, as in plain RLVR) -> pick underperforming
problems -> synthesize G_v problems per correct response -> solve each
synthetic problem G times (scored against the ORIGINAL answer) -> shape
synthesis rewards -> one buffer of types 1 + 2 + 3 (advantages per group, each
type with its own prompt), discarded after the update. Each phase is one
batched Sampler call (the originals: one per dynamic-sampling round). The
rules themselves live in `synthesis.svs` (pure).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr import rollout
from rlvr.common import settings
from rlvr.common.panel import Panel
from rlvr.methods.base import Group, Method, MethodSettings, Prompt, PromptPool, Rollout
from synthesis import svs

# svs.png's panels (`plots.plot_metrics`); the data types are docs/methods.md#svs's.
PLOT_KEYS = (
  "accuracy",
  Panel(
    "Groups in the update by data type",
    "groups",
    (
      ("type1_groups", "type 1: original problems"),
      ("type2_groups", "type 2: problem synthesis"),
      ("type3_groups", "type 3: synthetic problems"),
    ),
  ),
  Panel(
    "Synthetic problems by synthesis reward",
    "problems per step",
    (
      ("svs_accepted", "accepted (R_V = 1)"),
      ("svs_too_easy", "too easy"),
      ("svs_too_hard", "too hard"),
      ("svs_unparseable", "no problem extracted"),
    ),
  ),
  "synthetic_accuracy",
  Panel(
    "Accepted synthetic problems",
    "problems per step",
    (
      ("svs_accepted", "accepted"),
      ("svs_accepted_consistent", "accepted with the original's answer"),
    ),
  ),
)


class SvS(Method):
  """Solve, synthesize from underperforming problems' correct solutions, solve syntheses."""

  name = "svs"
  plot_keys = PLOT_KEYS
  progress_keys: Mapping[str, str] = {"syn": "svs_accepted"}

  def __init__(
    self, train: Sequence[Prompt], seed: int, cfg: svs.SvSConfig, template: str | None = None
  ):
    self.pool = PromptPool(train, seed)
    self.cfg, self.template = cfg, template

  def buffer(self, ctx: Rollout, step: int) -> tuple[list[Group], dict[str, float]]:
    rl = ctx.rl
    rng = random.Random(rollout.step_seed(rl.seed, step, 99))
    seed = lambda phase: rollout.step_seed(rl.seed, step, 100 + phase)  # apart from DS rounds
    if self.cfg.refill_originals:  # DAPO's dynamic sampling: up to prompts_per_step mixed groups
      kept, originals, rounds = ctx.gather(self.pool, step)
    else:  # the authors' loop: one draw, the mixed groups kept
      originals = ctx.groups(self.pool.draw(rl.prompts_per_step), rl.sampling_params(seed(0)))
      kept, rounds = [o for o in originals if o.mixed], 1
    type1 = [o for o in kept if o.mixed]
    under = [
      o
      for o in type1
      if svs.underperforming(float(o.correct.mean()), self.cfg.under_lo, self.cfg.under_hi)
    ]
    m = {"svs_underperforming": len(under)}
    if self.cfg.mode == "eup":  # ablation: a second rollout on underperforming problems
      again = ctx.groups([o.prompt for o in under], rl.sampling_params(seed(1))) if under else []
      type1 += [a for a in again if a.mixed]
      type2, type3 = [], []
    else:
      type2, type3 = self._synthesize(ctx, under, seed, rng, m)
    m.update({"type1_groups": len(type1), "type2_groups": len(type2), "type3_groups": len(type3)})
    # each group's data type (types 1, 2, 3) in the samples log
    for groups, data_type in (
      (originals + type1, "original"),
      (type2, "synthesis"),
      (type3, "synthetic"),
    ):
      for g in groups:
        g.tags["data_type"] = data_type
    ctx.report_rollouts(originals, type1, rounds)  # the step's metrics: originals, type 1
    return type1 + type2 + type3, m

  def _synthesize(self, ctx: Rollout, under: list[Group], seed, rng, m: dict):
    """Types 2 and 3 from the underperforming groups; adds the svs_* metrics to m."""
    cfg, rl = self.cfg, ctx.rl
    sources = [(o, c) for o in under for c, ok in zip(o.completions, o.correct) if ok]
    syn_ids = [
      ctx.encode_task(svs.build_synthesis_prompt(c.text, self.template)) for _, c in sources
    ]
    fits = [len(ids) <= rl.max_prompt_len for ids in syn_ids]  # too long: dropped, counted
    m["svs_synthesis_too_long"] = fits.count(False)
    sources = [s for s, ok in zip(sources, fits) if ok]
    syn_ids = [ids for ids, ok in zip(syn_ids, fits) if ok]
    syn_outs = []
    if syn_ids:
      sp = dataclasses.replace(rl.sampling_params(seed(2)), n=cfg.syntheses_per_solution)
      syn_outs = ctx.generate(syn_ids, sp)
    problems = [
      [svs.extract_problem(c.text, cfg.max_problem_chars) for c in outs] for outs in syn_outs
    ]
    m["svs_extraction_failures"] = sum(p is None for ps in problems for p in ps)
    # solve every extracted synthetic problem G times, against the ORIGINAL answer
    flat = [(i, k, p) for i, ps in enumerate(problems) for k, p in enumerate(ps) if p]
    syn_prompts = [ctx.prompt(p, sources[i][0].prompt.answer, "svs-synthetic") for i, _, p in flat]
    fits = [len(q.ids) <= rl.max_prompt_len for q in syn_prompts]
    m["svs_synthetic_too_long"] = fits.count(False)
    for (i, k, _), ok in zip(flat, fits):
      if not ok:  # a synthetic problem too long to solve counts as unparseable
        problems[i][k] = None
    flat = [f for f, ok in zip(flat, fits) if ok]
    syn_prompts = [q for q, ok in zip(syn_prompts, fits) if ok]
    solved = ctx.groups(syn_prompts, rl.sampling_params(seed(3))) if flat else []
    accs = [[None] * len(ps) for ps in problems]
    for (i, k, _), grp in zip(flat, solved):
      accs[i][k] = float(grp.correct.mean())
    type3 = [grp for grp in solved if grp.mixed]  # synthetic solving with 0 < acc < 1
    type2 = []  # synthesis groups with mixed R_V
    for i, (src, _) in enumerate(sources):
      rewards = svs.synthesis_rewards(accs[i], cfg, rng)
      if rewards is not None:
        rewards = np.asarray(rewards, np.float32)
        task = Prompt(tuple(syn_ids[i]), src.prompt.answer, "", "svs-synthesis")
        type2.append(Group(task, syn_outs[i], rewards, rewards > 0))
    reason = [[svs.rejection_reason(a, cfg) for a in row] for row in accs]
    reasons = [r for row in reason for r in row]
    if ctx.answer_of is not None:  # diagnostic: does the synthetic problem keep the answer?
      consistent = [ctx.answer_of(p) == q.answer for (_, _, p), q in zip(flat, syn_prompts)]
      accepted = [c for c, (i, k, _) in zip(consistent, flat) if reason[i][k] == "accepted"]
      m.update({"svs_consistent": sum(consistent), "svs_accepted_consistent": sum(accepted)})
    m.update(
      {
        "svs_correct_solutions": len(sources),
        "svs_syntheses": sum(len(ps) for ps in problems),
        "svs_accepted": reasons.count("accepted"),
        "svs_too_easy": reasons.count("too_easy"),
        "svs_too_hard": reasons.count("too_hard"),
        "svs_unparseable": reasons.count("unparseable"),
        "synthetic_accuracy": (
          float(np.mean([grp.correct.mean() for grp in solved])) if solved else float("nan")
        ),
      }
    )
    return type2, type3

  def state(self) -> dict[str, Any]:
    return {"data": self.pool.state()}

  def restore(self, state: Mapping[str, Any]) -> None:
    self.pool.restore(state["data"])

  def summary(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not rows:
      return {}
    accepted = [r.get("svs_accepted", 0) for r in rows]
    out = {
      "synthetic_accepted_per_step": accepted,
      "synthetic_accepted_mean": round(sum(accepted) / len(rows), 2),
    }
    if "svs_accepted_consistent" in rows[-1]:
      out["accepted_consistent_per_step"] = [r.get("svs_accepted_consistent", 0) for r in rows]
    out["buffer_types_per_step"] = [
      {f"type{t}": r.get(f"type{t}_groups", 0) for t in (1, 2, 3)} for r in rows
    ]
    return out


def synthesis_template(name: str) -> str | None:
  """ "default" (our wording), "code" (programming problems: synthesis.svs.code_template),
  "arithmetic" (the procedural task's short one) or a file path."""
  if name == "default":
    return None
  if name == "code":
    return svs.code_template()
  if name == "arithmetic":
    from rlvr.data.tasks import arithmetic

    return arithmetic.INVERSE_TEMPLATE
  try:
    with open(name) as f:
      return f.read()
  except OSError as e:
    raise ValueError(
      f"svs.template: {name!r} is none of default|code|arithmetic and not a file to read "
      f"({e.strerror})"
    ) from None


def check(cfg) -> svs.SvSConfig:
  c = settings.frozen(svs.SvSConfig, cfg.svs, prefix="svs.")
  synthesis_template(c.template)  # a one-line error naming a template file that is not there
  return c


def make(settings: MethodSettings, train: Sequence[Prompt]) -> SvS:
  c = settings.section
  return SvS(train, settings.seed, c, synthesis_template(c.template))
