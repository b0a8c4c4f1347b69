"""pass@k / avg@n evaluation of a sampler on problem sets, over several seeds."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Callable, Sequence

import numpy as np

from rlvr import envs
from rlvr.common import fileio
from rlvr.parallel import distributed
from rlvr.rollout import Group, Prompt, Rollout, stats
from rlvr.sampling.types import Sampler, SamplingParams

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  n: int = 8  # samples per problem
  seeds: tuple[int, ...] = (0,)  # repeat the whole evaluation per seed
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  repetition_penalty: float = 1.0  # vLLM / HF semantics; 1 = off
  max_tokens: int = 256
  batch_prompts: int = 64  # prompts per generate call

  def __post_init__(self):
    for name in ("n", "max_tokens", "batch_prompts"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    if not self.seeds:
      raise ValueError("seeds: give at least one sampling seed")
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
      raise ValueError(
        f"temperature / top_p / top_k: must be >= 0 / in (0, 1] / >= 0, got "
        f"{self.temperature} / {self.top_p} / {self.top_k}"
      )
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")


def fitting(
  prompts: Sequence[Prompt], max_tokens: int, context: int | None, name: str = "eval set"
) -> list[Prompt]:
  """The prompts whose prompt + max_tokens fit the model's context; the rest are skipped
  with a warning that counts them (never a crash halfway through an evaluation)."""
  if context is None:
    return list(prompts)
  kept = [p for p in prompts if len(p.ids) + max_tokens <= context]
  if len(kept) < len(prompts):
    log.warning(
      "%s: skipped %d of %d prompts longer than the model's context %d minus max_tokens %d",
      name,
      len(prompts) - len(kept),
      len(prompts),
      context,
      max_tokens,
    )
  return kept


def sample_record(seed: int, index: int, group: Group, notes: Sequence[dict] = ()) -> dict:
  """One problem's responses under one seed, as a line of samples_<set>.jsonl; `notes` (one
  dict per response, e.g. a program's verdict and reason) are merged into the responses'."""
  notes = list(notes) or [{}] * len(group.completions)
  return {
    "seed": seed,
    "index": index,
    "problem": group.prompt.text,
    "answer": group.prompt.answer,
    "responses": [
      {
        "text": c.text,
        "tokens": len(c.token_ids),
        "finish_reason": c.finish_reason,
        "reward": float(r),
        "correct": bool(ok),
        **envs.episode_record(c),
        **note,
      }
      for c, r, ok, note in zip(group.completions, group.rewards, group.correct, notes)
    ],
  }


@contextlib.contextmanager
def _written_when_done(path: str | None):
  """Yields a file open for writing (None for no path) that appears at `path` only if
  the block ends without an error: a failed evaluation never leaves a partial file."""
  if path is None:
    yield None
    return
  with fileio.atomic_open(path) as f:
    yield f


def _keeping(score_fn: Callable, notes: list) -> Callable:
  """`score_fn` as a `Rollout` calls it, (rewards, correct), its notes (if any) added to
  `notes` in response order."""

  def score(texts, golds, prompts=None):
    out = score_fn(texts, golds, prompts=prompts)
    notes.extend(out[2] if len(out) > 2 else [{}] * len(texts))
    return out[0], out[1]

  return score


def evaluate_set(
  sampler: Sampler,
  prompts: Sequence[Prompt],
  score_fn: Callable,
  cfg: EvalConfig,
  progress: bool = False,
  context: int | None = None,
  samples_path: str | None = None,
  episodes: envs.Episodes | None = None,
  well_formed: Callable[[str], bool] | None = None,
) -> dict:
  """{"pass@k": {k: (mean, std over seeds)}, "avg@n": (mean, std), "per_seed": [...],
  "skipped_too_long": count}, and with `well_formed` (a verifier's: does a response state
  a final answer at all) "well_formed": (mean, std) of the responses that do, so format and
  accuracy can be told apart.

  `score_fn(texts, golds, prompts=None)` returns (rewards, correct) or (rewards, correct,
  notes), a verifier's `judge`: the notes go into the samples file with their responses.

  Each batch of prompts is one `Rollout.groups`, as in training but unshaped (episodes: those of
  the run's multi-turn environment, `rlvr.envs`). With the
  model's `context` (max positions), prompts that cannot fit prompt + max_tokens
  are skipped and counted (`fitting`). With `samples_path`, every response is written
  there once the set is done (JSONL, one line per seed and problem: `sample_record`).
  """
  total = len(prompts)
  kept = fitting(prompts, cfg.max_tokens, context)
  if not kept:
    raise ValueError(
      f"evaluate_set: none of {total} prompts fits the model's context {context} "
      f"with max_tokens {cfg.max_tokens}; lower max_tokens"
    )
  kept_ids = {id(p) for p in kept}
  index = [i for i, p in enumerate(prompts) if id(p) in kept_ids]  # in the given set
  prompts = kept
  ks = stats.ks_up_to(cfg.n)
  per_seed = []
  with _written_when_done(samples_path) as samples:
    for seed in cfg.seeds:
      counts, formed, cut = [], 0, 0
      chunks = range(0, len(prompts), cfg.batch_prompts)
      if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc=f"eval seed {seed}", unit="batch", leave=False)
      for start in chunks:
        sp = SamplingParams(
          n=cfg.n,
          temperature=cfg.temperature,
          top_p=cfg.top_p,
          top_k=cfg.top_k,
          repetition_penalty=cfg.repetition_penalty,
          max_tokens=cfg.max_tokens,
          seed=seed * 100_003 + start,
        )
        notes: list[dict] = []
        judged = Rollout(sampler, _keeping(score_fn, notes), episodes=episodes)
        groups = judged.groups(prompts[start : start + cfg.batch_prompts], sp, shaped=False)
        counts += [int(g.correct.sum()) for g in groups]
        cut += sum(c.finish_reason == "length" for g in groups for c in g.completions)
        if well_formed is not None:
          formed += sum(bool(well_formed(c.answer_text)) for g in groups for c in g.completions)
        if samples is not None:
          samples.writelines(
            json.dumps(sample_record(seed, index[i], g, notes[j * cfg.n : (j + 1) * cfg.n])) + "\n"
            for j, (i, g) in enumerate(zip(range(start, len(prompts)), groups))
          )
      counts = np.asarray(counts)
      per_seed.append(
        {
          "seed": seed,
          "pass@k": {
            k: float(np.mean([stats.pass_at_k(cfg.n, int(c), k) for c in counts])) for k in ks
          },
          f"avg@{cfg.n}": float(counts.mean() / cfg.n),
          "correct_counts": counts.tolist(),
          "truncated": cut / max(len(counts) * cfg.n, 1),
        }
      )
      if well_formed is not None:
        per_seed[-1]["well_formed"] = formed / max(len(counts) * cfg.n, 1)
  agg = lambda xs: (float(np.mean(xs)), float(np.std(xs)))
  formed = {"well_formed": agg([s["well_formed"] for s in per_seed])} if well_formed else {}
  return formed | {
    "n": cfg.n,
    "problems": len(prompts),
    "skipped_too_long": total - len(prompts),
    "seeds": list(cfg.seeds),
    "pass@k": {k: agg([s["pass@k"][k] for s in per_seed]) for k in ks},
    f"avg@{cfg.n}": agg([s[f"avg@{cfg.n}"] for s in per_seed]),
    "truncated": agg([s["truncated"] for s in per_seed]),
    "per_seed": per_seed,
  }


def _pass_at_k_curve(ax, r: dict, label: str) -> None:
  """One evaluate_set result as a pass@k curve; the std over seeds as error bars, clipped
  to [0, 1] (a rate's error bar does not leave the range)."""
  ks = sorted(r["pass@k"], key=int)
  means = [r["pass@k"][k][0] for k in ks]
  stds = [r["pass@k"][k][1] for k in ks]
  yerr = [[min(s, m) for m, s in zip(means, stds)], [min(s, 1 - m) for m, s in zip(means, stds)]]
  ax.errorbar([int(k) for k in ks], means, yerr=yerr, marker="o", capsize=3, label=label)


def _seed_count(r: dict) -> int:
  """How many sampling seeds an evaluate_set result averages over."""
  return len(r.get("seeds") or r.get("per_seed") or [None])


def _percent(mean_std, seeds: int) -> str:
  """A rate in percent; `mean ± std` over the seeds when there are several."""
  mean, std = mean_std
  return f"{100 * mean:.1f} ± {100 * std:.1f}" if seeds > 1 else f"{100 * mean:.1f}"


def _seeds_note(results: dict[str, dict]) -> str:
  """The line under the table's title that says what its numbers are."""
  counts = sorted({_seed_count(r) for r in results.values()})
  if counts == [1]:
    return "pass@k and avg@n in percent, one sampling seed."
  return (
    f"pass@k and avg@n in percent, mean ± std over {' / '.join(map(str, counts))} sampling seeds."
  )


def result_line(title: str, name: str, r: dict) -> str:
  """One eval set's line (`evaluate_set`'s result): pass@1, pass@k at the largest k, the
  well-formed share, the problems and those skipped as too long."""
  k = max(r["pass@k"], key=int)
  skipped = f", {r['skipped_too_long']} too long skipped" if r["skipped_too_long"] else ""
  formed = f", {100 * r['well_formed'][0]:.1f}% well-formed" if "well_formed" in r else ""
  return (
    f"{title}: {name} pass@1 {100 * r['pass@k'][1][0]:.1f}% "
    f"(pass@{k} {100 * r['pass@k'][k][0]:.1f}%){formed}, {r['problems']} problems{skipped}"
  )


def write_report(results: dict[str, dict], outdir: str, title: str = "evaluation") -> dict:
  """Markdown table, CSV, JSON and a pass@k curve PNG for {set name: evaluate_set result}.

  The table gives `mean ± std` over the seeds when there are several, else the mean;
  the CSV and JSON always keep both.
  """
  os.makedirs(outdir, exist_ok=True)
  with open(os.path.join(outdir, "eval.json"), "w") as f:
    json.dump(results, f, indent=2)
  lines, csv = [], ["set,metric,k,mean,std"]
  for name, r in results.items():
    ks = sorted(r["pass@k"], key=int)
    if not lines:
      header = ["set"] + [f"pass@{k}" for k in ks] + [f"avg@{r['n']}"]
      lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    seeds = _seed_count(r)
    avg = r[f"avg@{r['n']}"]
    cells = [name] + [_percent(r["pass@k"][k], seeds) for k in ks] + [_percent(avg, seeds)]
    lines.append("| " + " | ".join(cells) + " |")
    csv += [f"{name},pass@k,{k},{r['pass@k'][k][0]:.6f},{r['pass@k'][k][1]:.6f}" for k in ks]
    csv.append(f"{name},avg@{r['n']},{r['n']},{avg[0]:.6f},{avg[1]:.6f}")
  with open(os.path.join(outdir, "eval.md"), "w") as f:
    f.write(f"# {title}\n\n{_seeds_note(results)}\n\n" + "\n".join(lines) + "\n")
  with open(os.path.join(outdir, "eval.csv"), "w") as f:
    f.write("\n".join(csv) + "\n")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5, 3.5))
  for name, r in results.items():
    _pass_at_k_curve(ax, r, name)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.set_ylabel("pass@k")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(outdir, "pass_at_k.png"), dpi=110)
  plt.close(fig)
  return {"markdown": os.path.join(outdir, "eval.md")}


def comparison_figure(reports: dict[str, dict], title: str = "pass@k"):
  """The matplotlib Figure `plot_comparison` saves (see there)."""
  from matplotlib.figure import Figure

  sets = sorted({name for r in reports.values() for name in r})
  fig = Figure(figsize=(4.5 * len(sets), 3.5))
  axes = fig.subplots(1, len(sets), squeeze=False)
  ends = []  # the lowest and highest point of every error bar
  for ax, name in zip(axes[0], sets):
    for label, results in reports.items():
      if name not in results:
        continue
      _pass_at_k_curve(ax, results[name], label)
      for mean, std in results[name]["pass@k"].values():
        ends += [max(mean - std, 0.0), min(mean + std, 1.0)]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(f"{title}: {name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  if ends:  # fitted to the data, so that a gain of a few points shows; a rate stays in [0, 1]
    low, high = min(ends), max(ends)
    pad = max(0.15 * (high - low), 0.02)
    for ax in axes[0]:
      ax.set_ylim(max(low - pad, -0.02), min(high + pad, 1.02))
  fig.tight_layout()
  return fig


def plot_comparison(reports: dict[str, dict], path: str, title: str = "pass@k") -> str:
  """pass@k curves of several evaluations ({label: {set: evaluate_set result}}) on one
  figure, one panel per eval set; every panel has the same y-range, fitted to the data with
  a margin (within [0, 1]); error bars clipped to [0, 1]."""
  comparison_figure(reports, title).savefig(path, dpi=110)
  return path


def evaluate_run(run, sampler, verifier, tag: str | None = None, episodes=None) -> dict:
  """pass@k of a run's (`workdir.Run`) every eval set under the verifier's judge (episodes: in the run's environment),
  with the share of responses that state an answer (`verifier.well_formed`) and of those cut
  at the length limit; with a tag, also a report under workdir/eval_<tag> and a line per set."""
  ecfg = run.settings.eval.sampling
  write = tag is not None and distributed.is_writer()
  outdir = os.path.join(run.workdir, f"eval_{tag}") if write else None
  judge, results = verifier.for_eval().judge, {}
  for name, prompts in run.eval_prompts.items():
    keep = write and run.settings.eval.samples
    results[name] = evaluate_set(
      sampler,
      prompts,
      judge,
      ecfg,
      progress=tag is not None,
      context=run.context,
      samples_path=os.path.join(outdir, f"samples_{name}.jsonl") if keep else None,
      episodes=episodes,
      well_formed=verifier.well_formed,
    )
  if write:
    write_report(results, outdir, f"eval {tag}")
    for name, r in results.items():  # one line per set, after the progress bars
      print(result_line(f"eval {tag.replace('_', ' ')}", name, r), flush=True)
  return {
    name: {f"pass@{k}": v[0] for k, v in r["pass@k"].items()}
    | ({"well_formed": r["well_formed"][0]} if "well_formed" in r else {})
    | {"truncated": r["truncated"][0]}
    for name, r in results.items()
  }
