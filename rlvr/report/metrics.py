"""Metric writers: metrics.jsonl, TensorBoard and wandb, resumed without duplicates."""

from __future__ import annotations

import json
import math
import os
import secrets
import string
import time
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr.common import fileio

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
    """cfg: the `logging` section (`rlvr.run.sections.LoggingConfig`); config: the run's."""
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

  def alert(self, title: str, text: str) -> None:
    """A wandb alert (email / Slack, as the user's wandb settings say) at level WARN; title cut
    to wandb's 64 characters, alerts of one title at most a second apart."""
    self.run.alert(title=title[:64], text=text, level="WARN", wait_duration=1)

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
  and to wandb with `logging.wandb` (`logging`: the run's `rlvr.run.sections.LoggingConfig`;
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

  def alert(self, title: str, text: str) -> None:
    """An alert where a tracker has them (wandb: `WandbTracker.alert`); nothing otherwise."""
    if self.enabled and self._wandb is not None:
      self._wandb.alert(title, text)

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
