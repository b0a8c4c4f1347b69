"""Run directories for tests that rerun a finished run's command: the copy starts past SFT."""

from __future__ import annotations

import json
import pathlib
import shutil


def start_from_sft(done: pathlib.Path, fresh: pathlib.Path, evaluated: bool = True) -> None:
  """Makes `fresh` a run directory holding `done`'s SFT and its evaluation before RL, so
  the same command (same seeds) run there skips to RL and evaluates again after it.
  evaluated=False: SFT only; the run evaluates before RL too (with its own eval settings)."""
  fresh.mkdir()
  shutil.copytree(done / "sft", fresh / "sft")
  progress = json.loads((done / "progress.json").read_text())
  del progress["eval_after"], progress["eval_after_step"]
  if not evaluated:
    progress = {"settings": {"sft": progress["settings"]["sft"]}}
  (fresh / "progress.json").write_text(json.dumps(progress))
