"""One SvS step (METHODS.md "SvS"), inside the RL loop.

solve originals (dynamic sampling, as in plain RLVR) -> pick underperforming
problems -> synthesize G_v problems per correct response -> solve each
synthetic problem G times (scored against the ORIGINAL answer) -> shape
synthesis rewards -> one GRPO update on the mixed buffer of types 1 + 2 + 3
(advantages per group, each type with its own prompt) -> discard. Each phase
is one batched Sampler call (the originals: one per dynamic-sampling round).
The rules themselves live in `synthesis.svs` (pure).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, Sequence

import numpy as np

from rlvr import loop
from rlvr.sampling.types import Sampler
from synthesis import svs


def _bucket(n: int, minimum: int, multiple: int = 1) -> int:
  n = max(n, minimum)
  b = 1 << (n - 1).bit_length()
  return -(-b // multiple) * multiple


def svs_step(state, update_fn, sampler: Sampler, draw: Callable[[int], list[int]],
             prompt_ids: Sequence[Sequence[int]], answers: Sequence[str],
             encode_problem: Callable[[str], list[int]], encode_task: Callable[[str], list[int]],
             score_fn: loop.ScoreFn, cfg: loop.RLConfig, svs_cfg: svs.SvSConfig, step: int,
             to_batch: Callable, pad_id: int = 0, template: str | None = None,
             true_answer: Callable[[str], str | None] | None = None):
  """Returns (new state, metrics). encode_problem: problem text -> solving prompt ids;
  encode_task: synthesis prompt text -> prompt ids (chat template, no instruction).
  true_answer (diagnostic only, for tasks that can compute it, e.g. arithmetic):
  problem text -> its exact answer; adds how many synthetic problems, and how
  many accepted ones, really have the original's answer. Training never uses it."""
  t0 = time.perf_counter()
  rng = random.Random(loop.step_seed(cfg.seed, step, 99))
  seed = lambda phase: loop.step_seed(cfg.seed, step, 100 + phase)  # apart from DS rounds
  # -- solve originals, with dynamic sampling as in RLVR (SvS trains on GRPO + DAPO's
  # clip-higher, token-level loss and dynamic sampling): up to prompts_per_step mixed groups
  kept, originals, rounds = loop.gather_groups(sampler, draw, prompt_ids, answers, score_fn,
                                               cfg, step)
  t_orig = time.perf_counter()
  buffer: list[loop.Group] = [o for o in kept if o.mixed]
  kinds = [1] * len(buffer)
  under = [o for o in buffer if svs.underperforming(float(o.correct.mean()),
                                                      svs_cfg.under_lo, svs_cfg.under_hi)]
  m = {"svs_underperforming": len(under)}

  if svs_cfg.mode == "eup":  # ablation: a second rollout on underperforming problems
    if under:
      again = loop.rollout(sampler, [o.example for o in under], prompt_ids, answers, score_fn,
                           cfg.sampling_params(seed(1)))
      extra = [a for a in again if a.mixed]
      buffer += extra
      kinds += [1] * len(extra)
  else:
    # -- synthesize: every correct response of an underperforming problem
    sources = [(o, c) for o in under for c, ok in zip(o.completions, o.correct) if ok]
    syn_prompts = [encode_task(svs.build_synthesis_prompt(c.text, template)) for _, c in sources]
    syn_outs = []
    if syn_prompts:
      sp = dataclasses.replace(cfg.sampling_params(seed(2)), n=svs_cfg.syntheses_per_solution)
      syn_outs = sampler.generate(syn_prompts, sp)
    problems = [[svs.extract_problem(c.text, svs_cfg.max_problem_chars) for c in outs]
                for outs in syn_outs]
    # -- solve every extracted synthetic problem G times, against the ORIGINAL answer
    flat = [(i, k, p) for i, ps in enumerate(problems) for k, p in enumerate(ps) if p]
    accs = [[None] * len(ps) for ps in problems]
    solved: list[loop.Group] = []
    if flat:
      syn_ids = [encode_problem(p) for _, _, p in flat]
      syn_answers = [answers[sources[i][0].example] for i, _, _ in flat]
      solved = loop.rollout(sampler, list(range(len(flat))), syn_ids, syn_answers, score_fn,
                            cfg.sampling_params(seed(3)))
      for (i, k, _), grp in zip(flat, solved):
        accs[i][k] = float(grp.correct.mean())
    # -- type 3: synthetic solving groups with 0 < acc < 1
    type3 = [grp for grp in solved if grp.mixed]
    # -- type 2: synthesis groups with mixed R_V
    type2 = []
    for i, (src, _) in enumerate(sources):
      bg = svs.synthesis_group("", [c.text for c in syn_outs[i]], accs[i], svs_cfg,
                               src.example, rng)
      if bg is not None:
        type2.append(loop.Group(src.example, syn_prompts[i], syn_outs[i],
                                np.asarray(bg.rewards, np.float32),
                                np.asarray(bg.rewards, np.float32) > 0))
    buffer += type2 + type3
    kinds += [2] * len(type2) + [3] * len(type3)
    reason = [[svs.rejection_reason(a, svs_cfg) for a in row] for row in accs]
    reasons = [r for row in reason for r in row]
    if true_answer is not None:
      consistent = [true_answer(p) == syn_answers[j] for j, (_, _, p) in enumerate(flat)]
      accepted = [c for c, (i, k, _) in zip(consistent, flat) if reason[i][k] == "accepted"]
      m.update({"svs_consistent": sum(consistent), "svs_accepted_consistent": sum(accepted)})
    m.update({
        "svs_correct_solutions": len(sources),
        "svs_syntheses": sum(len(ps) for ps in problems),
        "svs_extraction_failures": sum(p is None for ps in problems for p in ps),
        "svs_accepted": reasons.count("accepted"),
        "svs_too_easy": reasons.count("too_easy"),
        "svs_too_hard": reasons.count("too_hard"),
        "svs_unparseable": reasons.count("unparseable"),
        "synthetic_accuracy": (float(np.mean([grp.correct.mean() for grp in solved]))
                               if solved else float("nan")),
    })
  t_gen = time.perf_counter()

  m.update({"type1_groups": kinds.count(1), "type2_groups": kinds.count(2),
            "type3_groups": kinds.count(3)})
  m.update(loop.rollout_metrics(originals, [b for b, k in zip(buffer, kinds) if k == 1], rounds,
                                cfg))
  if not buffer:
    m.update({"skipped_update": 1, "time_step": time.perf_counter() - t0})
    sampler.update_weights(state.params, version=step + 1)
    return state, m
  rows = _bucket(sum(len(b.completions) for b in buffer), cfg.rows)
  longest = max(len(b.prompt_ids) + max(len(c.token_ids) for c in b.completions) for b in buffer)
  seq_len = _bucket(longest, cfg.seq_len, 16)
  arrays = loop.build_batch(buffer, cfg, pad_id, rows=rows, seq_len=seq_len)
  state, lm = update_fn(state, to_batch(arrays))
  m.update({k: float(v) for k, v in lm.items()})
  t_upd = time.perf_counter()
  sampler.update_weights(state.params, version=step + 1)
  end = time.perf_counter()
  m.update({"time_rollout_original": t_orig - t0, "time_synthesis": t_gen - t_orig,
            "time_update": t_upd - t_gen, "time_sync": end - t_upd, "time_step": end - t0,
            "skipped_update": 0})
  return state, m
