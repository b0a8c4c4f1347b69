"""Evaluation maths (pass@k, solve rates) and metric writers (jsonl, TensorBoard, plots)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Mapping

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  r"""Unbiased pass@k (Chen et al. 2021) from n samples of which c are correct.

  pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i); 1 when n-c < k.
  """
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_up_to(n: int) -> list[int]:
  """1, 2, 4, ... <= n."""
  return [2 ** i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def group_stats(correct_gn: np.ndarray) -> dict[str, float]:
  """Accuracy, solve_all and solve_none rates of [groups, n] correctness."""
  acc = correct_gn.mean(axis=1)
  return {"accuracy": float(acc.mean()), "solve_all": float((acc == 1).mean()),
          "solve_none": float((acc == 0).mean())}


class MetricsWriter:
  """Appends one JSON object per step to metrics.jsonl and mirrors scalars to TensorBoard.

  Reopening an existing file after a resume drops rows at or past `resume_step`
  so the file stays one row per step.
  """

  def __init__(self, workdir: str, resume_step: int | None = None, tensorboard: bool = True,
               enabled: bool = True):
    self.enabled = enabled
    if not enabled:   # multi-host: the processes other than 0 write nothing
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is not None and os.path.exists(self.path):
      kept = [r for r in read_jsonl(self.path) if r.get("step", -1) < resume_step]
      with open(self.path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    self._f = open(self.path, "a")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      except ImportError:  # optional: jsonl and plots still work
        self._tb = None

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step)}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self._f.write(json.dumps(row) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != "step":
          self._tb.add_scalar(k, v, step)
      self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    self._f.close()
    if self._tb is not None:
      self._tb.close()


def _jsonable(v):
  if isinstance(v, (np.generic,)):
    return v.item()
  if hasattr(v, "item") and getattr(v, "shape", None) == ():
    return v.item()
  return v


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _running_mean(values, window: int):
  out, acc = [], 0.0
  for i, v in enumerate(values):
    acc += v
    if i >= window:
      acc -= values[i - window]
    out.append(acc / min(i + 1, window))
  return out


def plot_metrics(rows: Iterable[Mapping[str, Any]], keys: Iterable[str], path: str,
                 title: str = "", marks: Iterable[float] = ()) -> str:
  """One small panel per metric over steps; saves a PNG.

  marks: steps drawn as dashed vertical lines on every panel (e.g. curriculum switches).

  Per-step metrics are drawn as faint points under a running mean; metrics
  logged only now and then (held-out evaluations) as a line with markers.
  Panels whose metric never changes (or is never logged) are left out.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = list(rows)
  series = {}
  for k in keys:
    pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None
           and not (isinstance(r[k], float) and math.isnan(r[k]))]
    if len({v for _, v in pts}) > 1:
      series[k] = pts
  cols = min(3, max(1, len(series)))
  nrows = max(1, math.ceil(len(series) / cols))
  fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
  for ax, (key, pts) in zip(axes.flat, series.items()):
    steps, values = zip(*pts)
    if len(pts) < len(rows) / 2:   # sparse: evaluations every N steps
      ax.plot(steps, values, marker="o", lw=1.2)
    else:
      window = max(3, len(pts) // 15)
      line, = ax.plot(steps, values, ".", alpha=0.3, ms=3)
      ax.plot(steps, _running_mean(list(values), window), color=line.get_color(), lw=1.5,
              label=f"{window}-step mean")
      ax.legend(fontsize=7, loc="best")
    for step in marks:
      ax.axvline(step, color="grey", ls="--", lw=0.8)
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(series):]:
    ax.axis("off")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
