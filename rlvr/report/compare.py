"""Several finished (or running) runs side by side: one PNG of their curves, one panel per
metric with every run on it, and a table of each run's final figures.

A run is its work dir: `metrics.jsonl` (one row per RL step, `rlvr.report.metrics.MetricsWriter`),
and the held-out evaluations before and after RL from `summary.json` (a finished run) or
`progress.json` (a run still going, or stopped).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from typing import Any, Iterable, Sequence

from rlvr.report import plots

# Held-out pass@1 of every eval set: before RL (step 0), each `eval.every` row, after RL.
HELDOUT = "pass@1"
DEFAULT_KEYS = (HELDOUT, "reward_mean", "entropy", "response_len_mean")
_MANY = 20  # more points than this: faint dots under a running mean


@dataclasses.dataclass
class LoggedRun:
  path: str
  name: str
  rows: list[dict[str, Any]]
  before: dict[str, dict[str, float]]  # {eval set: {"pass@1": ..., ...}} before RL
  after: dict[str, dict[str, float]]  # the same after RL ({} while RL has not finished)

  @property
  def steps(self) -> int:
    """RL steps logged."""
    return max((r["step"] + 1 for r in self.rows), default=0)


@dataclasses.dataclass
class Comparison:
  runs: list[LoggedRun]
  table: str  # Markdown: one row per run, its final figures
  notes: list[str]  # keys left out of a run's curves, or of the figure
  out: str | None  # the PNG written


def _json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


def load_run(path: str, name: str | None = None) -> LoggedRun:
  """A run's metrics rows and its evaluations before / after RL; one-line errors naming
  the dir when it is not there or holds no metrics.jsonl."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{path}: no such run directory")
  rows_path = os.path.join(path, "metrics.jsonl")
  if not os.path.exists(rows_path):
    raise FileNotFoundError(
      f"{path}: no metrics.jsonl (not a run's work dir, or no RL step has been logged yet)"
    )
  rows = []
  with open(rows_path) as f:
    for i, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:
          raise ValueError(f"{rows_path}: line {i} is not JSON") from None
  before, after = {}, {}
  summary_path, progress_path = (os.path.join(path, f) for f in ("summary.json", "progress.json"))
  if os.path.exists(summary_path):
    summary = _json(summary_path)
    before, after = summary.get("eval_before_rl") or {}, summary.get("eval_after_rl") or {}
  elif os.path.exists(progress_path):
    progress = _json(progress_path)
    before, after = progress.get("eval_before") or {}, progress.get("eval_after") or {}
  return LoggedRun(path, name or os.path.basename(os.path.normpath(path)), rows, before, after)


def _names(paths: Sequence[str]) -> list[str]:
  """Each run's dir name; as many trailing path parts as make them differ."""
  parts = [os.path.abspath(p).split(os.sep) for p in paths]
  for n in range(1, max(len(p) for p in parts) + 1):
    names = [os.sep.join(p[-n:]) for p in parts]
    if len(set(names)) == len(names):
      return names
  return [f"{name} ({i + 1})" for i, name in enumerate(names)]


def _has(run: LoggedRun, key: str) -> bool:
  if key == HELDOUT:
    return any(s.pts for s in plots._heldout(run.rows, run.before, run.after))
  return bool(plots._points(run.rows, key))


def _notes(runs: list[LoggedRun], keys: Sequence[str]) -> tuple[list[str], list[str]]:
  """(keys some run has, notes on the keys a run lacks)."""
  kept, notes = [], []
  known = sorted({k for r in runs for row in r.rows for k in row} - {"step"})
  for key in keys:
    missing = [r.name for r in runs if not _has(r, key)]
    if len(missing) == len(runs):
      what = "held-out evaluations" if key == HELDOUT else f"{key!r}"
      near = difflib.get_close_matches(key, known, n=3)
      hint = f" (close: {', '.join(near)})" if near else ""
      notes.append(f"note: no run has {what}; no panel for it{hint}")
      continue
    kept.append(key)
    for name in missing:
      what = "no held-out evaluation" if key == HELDOUT else f"no {key!r} in its metrics.jsonl"
      notes.append(f"note: {name}: {what}; left out of that panel")
  return kept, notes


def _draw_series(ax, pts, color, label: str, style: str = "-", marker: str = "o") -> int:
  """A line with markers, or faint dots under a running mean; returns its window (0: none)."""
  steps, values = zip(*pts)
  if len(pts) <= _MANY:
    ax.plot(steps, values, style, marker=marker, ms=4, lw=1.3, color=color, label=label)
    return 0
  window = max(3, len(pts) // 15)
  ax.plot(steps, values, ".", ms=3, alpha=0.25, color=color)
  ax.plot(steps, plots._running_mean(list(values), window), style, lw=1.5, color=color, label=label)
  return window


_SET_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def figure(runs: list[LoggedRun], keys: Sequence[str]):
  """The matplotlib Figure: one panel per key, every run on it in its own colour; the
  panels share the RL-step axis. Panel size is fixed: 5 x 3.4 inches."""
  from matplotlib import rcParams
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  colors = rcParams["axes.prop_cycle"].by_key()["color"]
  cols = min(2, max(1, len(keys)))
  nrows = max(1, math.ceil(len(keys) / cols))
  fig = Figure(figsize=(5.0 * cols, 3.4 * nrows))
  axes = fig.subplots(nrows, cols, squeeze=False, sharex=True)
  for ax, key in zip(axes.flat, keys):
    windows = [0]
    for i, run in enumerate(runs):
      color = colors[i % len(colors)]
      if key == HELDOUT:
        series = [s for s in plots._heldout(run.rows, run.before, run.after) if s.pts]
        for j, s in enumerate(series):
          style, marker = _SET_STYLES[j % len(_SET_STYLES)]
          label = run.name if len(series) == 1 else f"{run.name}: {s.label}"
          windows.append(_draw_series(ax, s.pts, color, label, style, marker))
      elif pts := plots._points(run.rows, key):
        windows.append(_draw_series(ax, pts, color, run.name))
    title, unit = plots.label(plots.HELDOUT if key == HELDOUT else key)
    ax.set_title(title if key == HELDOUT else f"{title} ({key})", fontsize=9)
    ax.set_ylabel(unit, fontsize=8)
    xlabel = "RL steps done" if key == HELDOUT else "RL step"
    if max(windows):
      xlabel += f" (lines: {max(windows)}-step running means of the dots)"
    ax.set_xlabel(xlabel, fontsize=8)
    ax.xaxis.set_tick_params(labelbottom=True)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
  for ax in list(axes.flat)[len(keys) :]:
    ax.axis("off")
  fig.suptitle(" vs ".join(r.name for r in runs), fontsize=10)
  fig.tight_layout()
  return fig


def _cell(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, bool) or isinstance(value, int):
    return str(int(value))
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


def _percent(value) -> str:
  return "-" if value is None else f"{100 * value:.1f}%"


def _last(rows, key: str):
  pts = plots._points(rows, key)
  return pts[-1][1] if pts else None


def table(runs: list[LoggedRun], keys: Sequence[str]) -> str:
  """Markdown: per run its RL steps, each key's value at its last logged step, and each eval
  set's pass@1 before and after RL (after: the last `eval.every` value, `(step N)`, while
  RL has not finished)."""
  metric_keys = [k for k in keys if k != HELDOUT]
  sets = sorted({s for r in runs for s in (*r.before, *r.after)}) if HELDOUT in keys else []
  header = ["run", "RL steps", *metric_keys]
  for s in sets:
    header += [f"{s} pass@1 before RL", f"{s} pass@1 after RL"]
  lines = [header]
  for r in runs:
    cells = [r.name, str(r.steps), *(_cell(_last(r.rows, k)) for k in metric_keys)]
    for s in sets:
      cells.append(_percent(r.before.get(s, {}).get("pass@1")))
      after = r.after.get(s, {}).get("pass@1")
      during = plots._points(r.rows, f"{s}_pass@1")
      if after is None and during:
        cells.append(f"{_percent(during[-1][1])} (step {during[-1][0] + 1})")
      else:
        cells.append(_percent(after))
    lines.append(cells)
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
  return "\n".join(
    [fmt(lines[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    + [fmt(c) for c in lines[1:]]
  )


def compare(
  paths: Sequence[str], keys: Iterable[str] = DEFAULT_KEYS, out: str | None = "compare.png"
) -> Comparison:
  """Reads every run (`load_run`), writes the figure to `out` (None: no figure) and returns
  the table of final figures with notes on the keys a run lacks (`HELDOUT`, "pass@1": the
  held-out pass@1 of every eval set)."""
  if not paths:
    raise ValueError("no runs to compare; give their work dirs")
  runs = [load_run(p, name) for p, name in zip(paths, _names(paths))]
  keys = list(dict.fromkeys(keys))
  kept, notes = _notes(runs, keys)
  if out is not None:
    if not kept:
      raise ValueError(f"none of the keys {', '.join(keys)} is in any run; nothing to draw")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure(runs, kept).savefig(out, dpi=100)
  return Comparison(runs, table(runs, kept), notes, out)
