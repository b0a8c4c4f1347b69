"""Plots of a run's metrics: one panel per metric key over the RL steps (training.png, the
method's own .png), held-out pass@1 before and after RL marked."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping

import numpy as np

from rlvr.common.panel import Panel


def _running_mean(values, window: int):
  out, acc = [], 0.0
  for i, v in enumerate(values):
    acc += v
    if i >= window:
      acc -= values[i - window]
    out.append(acc / min(i + 1, window))
  return out


# A plot key: held-out pass@1 of every eval set, from the before-RL evaluation (step 0), the
# rows' `<set>_pass@1` (eval.every) and the after-RL evaluation (the last step).
HELDOUT = "*_pass@1"

# Metric key -> (panel title, y-axis label).
LABELS: dict[str, tuple[str, str]] = {
  HELDOUT: ("Held-out pass@1", "fraction of problems solved (1 sample)"),
  "accuracy": ("Training accuracy", "fraction of responses correct"),
  "reward_mean": ("Mean training reward", "reward per response"),
  "entropy": ("Policy entropy", "nats per token"),
  "solve_all": ("Training groups all correct", "fraction of groups"),
  "solve_none": ("Training groups none correct", "fraction of groups"),
  "response_len_mean": ("Mean response length", "tokens"),
  "response_len_max": ("Longest response", "tokens"),
  "truncated_frac": ("Responses cut at the length limit", "fraction of responses"),
  "groups_kept": ("Groups in the update", "groups"),
  "optimizer_steps": ("Optimizer steps per RL step", "steps"),
  "kl_first_last": ("KL from the step's first policy to its last", "nats per token (k3)"),
  "grad_norm": ("Gradient norm", "global L2 norm"),
  "lr": ("Learning rate", "learning rate"),
  "loss": ("Policy loss", "loss"),
  "shaping_overlong": ("Overlong-response penalty", "mean reward term per response"),
  "shaping_format": ("Format bonus", "mean reward term per response"),
  "depth": ("Composition depth trained on", "problems per composed problem"),
  "svs_underperforming": ("Underperforming problems", "problems"),
  "synthetic_accuracy": ("Accuracy on synthetic problems", "fraction of responses correct"),
  "qbq_round": ("QbQ round", "round"),
  "qbq_vendi": ("Diversity of accepted variants", "Vendi score (trigrams)"),
}


def label(key: str) -> tuple[str, str]:
  """(panel title, y-axis label) of a metric key; a readable form of unknown keys."""
  if key in LABELS:
    return LABELS[key]
  if key.startswith("time_"):
    return f"Time per RL step: {key[len('time_') :].replace('_', ' ')}", "seconds"
  words = key.replace("_", " ")
  return words[:1].upper() + words[1:], ""


@dataclasses.dataclass
class _Series:
  key: str
  label: str
  pts: list  # (step, value)
  same: list = dataclasses.field(default_factory=list)  # dropped keys with these values

  def varies(self) -> bool:
    return len({v for _, v in self.pts}) > 1

  def legend(self) -> str:
    return self.label + (f" (= {', '.join(self.same)})" if self.same else "")


def _points(rows, key: str) -> list:
  return [
    (r["step"], r[key])
    for r in rows
    if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))
  ]


def _heldout(rows, before, after) -> list[_Series]:
  """pass@1 per eval set at RL steps done: 0 (before RL), each eval row, the end (after RL)."""
  before, after = before or {}, after or {}
  suffix = "_pass@1"
  names = (
    set(before) | set(after) | {k[: -len(suffix)] for r in rows for k in r if k.endswith(suffix)}
  )
  end = max((r["step"] + 1 for r in rows), default=0)
  out = []
  for name in sorted(names):
    pts = [(0, before[name]["pass@1"])] if "pass@1" in before.get(name, {}) else []
    pts += [(s + 1, v) for s, v in _points(rows, name + suffix)]
    if "pass@1" in after.get(name, {}):
      pts.append((end, after[name]["pass@1"]))
    out.append(_Series(name, name, pts))
  return out


def _same(a: _Series, b: _Series) -> bool:
  if a.key == b.key or [s for s, _ in a.pts] != [s for s, _ in b.pts]:
    return False
  return bool(np.allclose([v for _, v in a.pts], [v for _, v in b.pts], rtol=1e-5, atol=1e-8))


def _panels(rows, keys, before, after) -> list[tuple[str, str, list[_Series], bool]]:
  """(title, unit, series, held-out?) of each panel that has something to show.

  A series equal to an earlier one under another key is dropped and named in the
  earlier one's legend; a panel is kept while one of its series changes.
  """
  out, seen = [], []
  for key in keys:
    if key == HELDOUT:
      series = [s for s in _heldout(rows, before, after) if s.pts]
      if series:
        out.append((*label(HELDOUT), series, True))
      continue
    panel = key if isinstance(key, Panel) else Panel(*label(key), ((key, key),))
    series = []
    for k, name in panel.series:
      s = _Series(k, name, _points(rows, k))
      twin = next((t for t in seen if s.varies() and _same(t, s)), None)
      if twin is not None:
        twin.same.append(k)
      elif s.pts:
        series.append(s)
        seen.append(s)
    if any(s.varies() for s in series):
      out.append((panel.title, panel.unit, series, False))
  return out


def _draw(ax, series: _Series, n_rows: int) -> int:
  """One series on `ax`: sparse ones as a line with markers, per-step ones as faint
  points under a running mean; returns the running mean's window (0 for none)."""
  steps, values = zip(*series.pts)
  if len(series.pts) < n_rows / 2:  # sparse: evaluations every N steps
    ax.plot(steps, values, marker="o", lw=1.2, label=series.legend())
    return 0
  window = max(3, len(series.pts) // 15)
  (line,) = ax.plot(steps, values, ".", alpha=0.3, ms=3)
  ax.plot(
    steps,
    _running_mean(list(values), window),
    color=line.get_color(),
    lw=1.5,
    label=series.legend(),
  )
  return window


def _draw_heldout(ax, series: _Series, before: bool, after: bool) -> None:
  """pass@1 of one eval set as a line with markers; the before/after-RL points labelled."""
  steps, values = zip(*series.pts)
  ax.plot(steps, values, marker="o", lw=1.2, label=series.legend())
  ends = [(0, "before RL", "left")] * before + [(len(steps) - 1, "after RL", "right")] * after
  for i, text, align in ends:
    ax.annotate(
      f"{text}: {values[i]:.3f}",
      (steps[i], values[i]),
      fontsize=7,
      textcoords="offset points",
      xytext=(0, 6),
      ha=align,
    )


def metrics_figure(
  rows: Iterable[Mapping[str, Any]],
  keys: Iterable[str | Panel],
  title: str = "",
  marks: Iterable[float] = (),
  before: Mapping[str, Mapping[str, float]] | None = None,
  after: Mapping[str, Mapping[str, float]] | None = None,
):
  """The matplotlib Figure `plot_metrics` saves (see there)."""
  from matplotlib.figure import Figure

  rows, marks = list(rows), list(marks)
  panels = _panels(rows, list(keys), before, after)
  cols = min(3, max(1, len(panels)))
  nrows = max(1, math.ceil(len(panels) / cols))
  fig = Figure(figsize=(4.4 * cols, 3.1 * nrows))
  axes = fig.subplots(nrows, cols, squeeze=False)
  for ax, (panel_title, unit, series, heldout) in zip(axes.flat, panels):
    windows = []
    for s in series:
      if heldout:
        _draw_heldout(ax, s, s.key in (before or {}), s.key in (after or {}))
      else:
        windows.append(_draw(ax, s, len(rows)))
    if heldout:  # room for the labels; a rate's axis stays about [0, 1]
      ax.margins(x=0.08, y=0.3)
      low, high = ax.get_ylim()
      ax.set_ylim(max(low, -0.02), min(high, 1.02))
    for step in marks:
      ax.axvline(step, color="grey", ls="--", lw=0.8)
    ax.set_title(panel_title, fontsize=9)
    ax.set_ylabel(unit, fontsize=8)
    xlabel = "RL steps done" if heldout else "RL step"
    if max(windows, default=0):
      xlabel += f" (line: {max(windows)}-step running mean of the dots)"
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
  for ax in list(axes.flat)[len(panels) :]:
    ax.axis("off")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig


def plot_metrics(
  rows: Iterable[Mapping[str, Any]],
  keys: Iterable[str | Panel],
  path: str,
  title: str = "",
  marks: Iterable[float] = (),
  before: Mapping[str, Mapping[str, float]] | None = None,
  after: Mapping[str, Mapping[str, float]] | None = None,
) -> str:
  """Saves a PNG at `path` of one panel per plot key over the RL steps; returns `path`.

  keys: metric keys (a panel titled from `LABELS`), `Panel`s (several series of one
  quantity, with a legend) and `HELDOUT` (held-out pass@1, with the `before` and
  `after` RL evaluations, {eval set: {"pass@1": value}}, at the first and last steps).
  marks: steps drawn as dashed vertical lines on every panel (e.g. curriculum switches).

  Per-step metrics are drawn as faint points under a running mean; metrics
  logged only now and then (held-out evaluations) as a line with markers.
  A series equal to an earlier one (accuracy and reward_mean under binary
  rewards) is drawn once, its key named in the legend; panels whose metrics
  never change (or are never logged) are left out.
  """
  metrics_figure(rows, keys, title, marks, before, after).savefig(path, dpi=110)
  return path


# training.png's panels: held-out pass@1 first, then the RL step's.
TRAINING_PANELS = (
  HELDOUT,
  "accuracy",
  "reward_mean",
  "entropy",
  Panel(
    "Training groups all or none correct",
    "fraction of groups",
    (
      ("solve_all", "all correct (too easy: no signal)"),
      ("solve_none", "none correct (too hard: no signal)"),
    ),
  ),
  "response_len_mean",
  "truncated_frac",
  Panel(  # multi-turn environments (rlvr.envs)
    "Episodes",
    "per episode",
    (("turns_mean", "turns"), ("tool_calls_mean", "tool calls")),
  ),
  "optimizer_steps",
  Panel(
    "Tokens clipped by the PPO ratio",
    "fraction of tokens",
    (
      ("clip_frac_high", "high: ratio > 1 + eps_high, A > 0"),
      ("clip_frac_low", "low: ratio < 1 - eps_low, A < 0"),
    ),
  ),
  "kl_first_last",
  "grad_norm",
  "shaping_overlong",
  Panel(
    "Wall time per RL step",
    "seconds",
    (
      ("time_step", "whole step"),
      ("time_sample", "sampling"),
      ("time_score", "scoring"),
      ("time_update", "update"),
      ("time_sync", "weight sync"),
    ),
  ),
)
