"""Evaluation maths (pass@k, solve rates) and metric writers (jsonl, TensorBoard, wandb, plots)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import string
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from rlvr import fileio


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
  return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def group_stats(correct_gn: np.ndarray) -> dict[str, float]:
  """Accuracy, solve_all and solve_none rates of [groups, n] correctness."""
  acc = correct_gn.mean(axis=1)
  return {
    "accuracy": float(acc.mean()),
    "solve_all": float((acc == 1).mean()),
    "solve_none": float((acc == 0).mean()),
  }


WANDB_RUN_ID = "wandb_run_id"  # file in the work dir: the wandb run a rerun continues
WANDB_MISSING = (
  "logging.wandb: the wandb package is not installed; pip install wandb "
  "(or pip install -e '.[tracking]'), or leave logging.wandb False"
)


def import_wandb():
  """The wandb module; a missing package is a one-line error saying how to install it."""
  try:
    import wandb
  except ImportError:
    raise ValueError(WANDB_MISSING) from None
  return wandb


def wandb_run_id(workdir: str) -> str:
  """The id of the work dir's wandb run, made and kept in workdir/wandb_run_id on first use,
  so a resumed run logs into the same wandb run."""
  path = os.path.join(workdir, WANDB_RUN_ID)
  if os.path.exists(path):
    with open(path) as f:
      run_id = f.read().strip()
    if run_id:
      return run_id
  alphabet = string.ascii_lowercase + string.digits
  run_id = "".join(secrets.choice(alphabet) for _ in range(8))
  with fileio.atomic_open(path) as f:
    f.write(run_id + "\n")
  return run_id


class WandbTracker:
  """One wandb run per work dir: the resolved config, then each metrics row against its RL step.

  Rows are plotted against their `step` key (wandb's own step only counts calls), so the
  steps a resumed run logs again after its last checkpoint do not have to be greater
  than the ones logged before the stop.
  """

  def __init__(self, cfg, workdir: str, config: Mapping[str, Any] | None = None):
    """cfg: the `logging` section (`rlvr.experiment.LoggingConfig`); config: the run's."""
    wandb = import_wandb()
    self.run = wandb.init(
      project=cfg.wandb_project,
      entity=cfg.wandb_entity or None,
      name=cfg.wandb_name or os.path.basename(os.path.normpath(workdir)),
      tags=list(cfg.wandb_tags) or None,
      config=dict(config) if config is not None else None,
      dir=cfg.wandb_dir or os.environ.get("WANDB_DIR") or workdir,
      mode=cfg.wandb_mode or None,
      id=wandb_run_id(workdir),
      resume="allow",
    )
    self.run.define_metric("step")
    self.run.define_metric("*", step_metric="step")

  def log(self, row: Mapping[str, Any]) -> None:
    self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))})

  def log_table(self, step: int, tag: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows as a wandb Table at `step` (the columns of the first row; values other than
    numbers, strings and booleans as JSON)."""
    wandb = import_wandb()
    cols = list(rows[0])
    cell = lambda v: v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
    table = wandb.Table(columns=cols, data=[[cell(r.get(c)) for c in cols] for r in rows])
    self.run.log({tag: table, "step": int(step)})

  def close(self) -> None:
    self.run.finish()


def _drop_tensorboard_steps(logdir: str, step: int) -> None:
  """Removes the events at or past `step` from the TensorBoard files in `logdir` (a file left
  with none is deleted), so that the steps a resumed run logs again appear once. Records are
  copied whole (length, checksums and all); one cut short by a crash, and what follows bytes
  that are no record, is dropped."""
  from google.protobuf.message import DecodeError
  from tensorboardX.proto import event_pb2

  if not os.path.isdir(logdir):
    return
  for name in sorted(os.listdir(logdir)):
    if not name.startswith("events.out.tfevents."):
      continue
    path = os.path.join(logdir, name)
    with open(path, "rb") as f:
      data = f.read()
    kept, scalars, pos = [], 0, 0
    while pos + 12 <= len(data):  # a record: u64 length, u32 crc, data, u32 crc
      end = pos + 12 + int.from_bytes(data[pos : pos + 8], "little") + 4
      if end > len(data):
        break
      try:
        event = event_pb2.Event.FromString(data[pos + 12 : end - 4])
      except DecodeError:  # bytes that are no record: the rest of the file goes
        break
      if event.HasField("file_version") or event.step < step:
        kept.append(data[pos:end])
        scalars += event.HasField("summary")
      pos = end
    if not scalars:
      os.remove(path)
    elif sum(map(len, kept)) < len(data):
      with fileio.atomic_open(path, "wb") as f:
        f.write(b"".join(kept))


class MetricsWriter:
  """Appends one JSON object per step to metrics.jsonl and mirrors scalars to TensorBoard,
  and to wandb with `logging.wandb` (`logging`: the run's `rlvr.experiment.LoggingConfig`;
  `config`: what the wandb run records as its config).

  Reopening an existing file after a resume drops rows at or past `resume_step`
  so the file stays one row per step; the TensorBoard files drop those steps too (a new
  events file holds the rest). A NaN or infinite value is written to metrics.jsonl as it
  is and left out of TensorBoard.
  """

  def __init__(
    self,
    workdir: str,
    resume_step: int | None = None,
    tensorboard: bool = True,
    enabled: bool = True,
    logging=None,
    config: Mapping[str, Any] | None = None,
  ):
    self.enabled = enabled
    if not enabled:  # multi-host: the processes other than 0 write nothing
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is not None and os.path.exists(self.path):
      kept = [r for r in read_jsonl(self.path) if r.get("step", -1) < resume_step]
      with open(self.path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    self._tb = self._wandb = None
    if logging is not None and logging.wandb:
      self._wandb = WandbTracker(logging, workdir, config)
    self._f = open(self.path, "a")
    if tensorboard and (logging is None or logging.tensorboard):
      try:
        from tensorboardX import SummaryWriter

        logdir = os.path.join(workdir, "tensorboard")
        if resume_step is not None:
          _drop_tensorboard_steps(logdir, resume_step)
        # tensorboardX names a file by the second and the host: a writer opened in the same
        # second as the last one would empty that one's file, or (any suffix) sort before it.
        self._tb = SummaryWriter(logdir, filename_suffix=f".{time.time_ns()}")
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
        if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
          self._tb.add_scalar(k, v, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(row)

  def write_table(self, step: int, tag: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of text at `step` under `tag`: TensorBoard's Text tab (`markdown`), a wandb
    Table; not in metrics.jsonl."""
    if not self.enabled or not rows:
      return
    if self._tb is not None:
      self._tb.add_text(tag, markdown(rows), step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log_table(step, tag, rows)

  def close(self) -> None:
    if not self.enabled:
      return
    self._f.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """Rows as Markdown, one block each: its short fields on one line, then each text field
  of several lines or over 60 characters as an indented code block (shown as written)."""
  long = lambda v: isinstance(v, str) and ("\n" in v or len(v) > 60)
  blocks = []
  for r in rows:
    head = ", ".join(f"{k} **{v}**" for k, v in r.items() if not long(v))
    body = [
      f"{k}:\n\n" + "\n".join("    " + line for line in v.split("\n"))
      for k, v in r.items()
      if long(v)
    ]
    blocks.append("\n\n".join([head, *body]))
  return "\n\n---\n\n".join(blocks)


def _jsonable(v):
  if isinstance(v, (np.generic,)):
    return v.item()
  if hasattr(v, "item") and getattr(v, "shape", None) == ():
    return v.item()
  return v


read_jsonl = fileio.read_jsonl  # metrics.jsonl rows


def _running_mean(values, window: int):
  out, acc = [], 0.0
  for i, v in enumerate(values):
    acc += v
    if i >= window:
      acc -= values[i - window]
    out.append(acc / min(i + 1, window))
  return out


@dataclasses.dataclass(frozen=True)
class Panel:
  """A plot key drawing several series of one quantity on one panel, with a legend."""

  title: str
  unit: str  # the y-axis label
  series: tuple[tuple[str, str], ...]  # (metric key, legend label)


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
