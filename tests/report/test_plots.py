"""training.png / <method>.png panels (`plots.plot_metrics`) and the launchers' terminal."""

from __future__ import annotations

import os
import subprocess
import sys

import run_output
from paths import REPO as ROOT

from rlvr.methods import svs
from rlvr.report import plots
from rlvr.run import evaluation


def _rows(steps=20, every=0):
  """Hand-written metrics rows: binary rewards (reward_mean == accuracy), evals every N."""
  rows = []
  for s in range(steps):
    acc = 0.3 + 0.02 * s
    row = {
      "step": s,
      "accuracy": acc,
      "reward_mean": acc,
      "entropy": 1.0 - 0.01 * s,
      "grad_norm": 1.0 + (s % 3),
      "response_len_mean": 20.0 + s,
      "solve_all": 0.1 + 0.01 * s,
      "solve_none": 0.5 - 0.01 * s,
      "type1_groups": 10 + s % 2,
      "type2_groups": s % 3,
      "type3_groups": 5 + s % 4,
    }
    if every and (s + 1) % every == 0:
      row["heldout_pass@1"] = 0.4 + 0.01 * s
    rows.append(row)
  return rows


def _panels(fig) -> dict[str, list[str]]:
  """{panel title: legend texts} of the figure's drawn panels."""
  return {
    ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()]
    for ax in fig.axes
    if ax.axison
  }


def test_panels_are_titled_in_words_and_the_png_is_written(tmp_path):
  path = str(tmp_path / "training.png")
  assert plots.plot_metrics(_rows(), plots.TRAINING_PANELS, path, title="run") == path
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  fig = plots.metrics_figure(
    _rows(), ["accuracy", "response_len_mean", "grad_norm", "entropy", "my_new_metric_x"]
  )
  axes = [ax for ax in fig.axes if ax.axison]
  assert [ax.get_title() for ax in axes] == [
    "Training accuracy",
    "Mean response length",
    "Gradient norm",
    "Policy entropy",
  ]
  assert [ax.get_ylabel() for ax in axes[:2]] == ["fraction of responses correct", "tokens"]
  assert plots.label("my_new_metric_x") == ("My new metric x", "")
  assert plots.label("time_update") == ("Time per RL step: update", "seconds")


def test_a_series_equal_to_an_earlier_one_is_drawn_once():
  panels = _panels(plots.metrics_figure(_rows(), plots.TRAINING_PANELS))
  assert panels["Training accuracy"] == ["accuracy (= reward_mean)"]
  assert "Mean training reward" not in panels
  shaped = [dict(r, reward_mean=r["accuracy"] - 0.1) for r in _rows()]  # a penalty term
  panels = _panels(plots.metrics_figure(shaped, plots.TRAINING_PANELS))
  assert panels["Training accuracy"] == ["accuracy"]
  assert panels["Mean training reward"] == ["reward_mean"]


def test_heldout_panel_has_before_during_and_after_rl_points():
  before, after = {"heldout": {"pass@1": 0.25}}, {"heldout": {"pass@1": 0.6}}
  fig = plots.metrics_figure(_rows(every=10), plots.TRAINING_PANELS, before=before, after=after)
  [ax] = [ax for ax in fig.axes if ax.get_title() == "Held-out pass@1"]
  [line] = ax.get_lines()
  # RL steps done: 0 before RL, 10 and 20 after rows 9 and 19, 20 again after RL.
  assert list(line.get_xdata()) == [0, 10, 20, 20]
  assert list(line.get_ydata()) == [0.25, 0.4 + 0.09, 0.4 + 0.19, 0.6]
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["heldout"]
  assert {t.get_text() for t in ax.texts} == {"before RL: 0.250", "after RL: 0.600"}
  # Without evaluations there is no held-out panel.
  assert "Held-out pass@1" not in _panels(plots.metrics_figure(_rows(), plots.TRAINING_PANELS))


def test_svs_data_types_share_one_panel_with_a_legend():
  panels = _panels(plots.metrics_figure(_rows(), svs.PLOT_KEYS))
  assert panels["Groups in the update by data type"] == [
    "type 1: original problems",
    "type 2: problem synthesis",
    "type 3: synthetic problems",
  ]


def test_pass_at_k_axis_fits_a_gain_of_a_few_points(tmp_path):
  def report(pass1, pass4):  # eval.json as evaluate_set writes it: (mean, std) per k
    return {"heldout": {"pass@k": {"1": [pass1, 0.01], "4": [pass4, 0.0]}, "n": 4}}

  reports = {"before RL": report(0.40, 0.52), "after RL": report(0.43, 0.55)}
  [ax] = evaluation.comparison_figure(reports, "run").axes
  low, high = ax.get_ylim()
  # 0.39 .. 0.55 with a margin, not 0 .. 1 (where a 3-point gain is a few pixels)
  assert 0.35 < low < 0.385 and 0.555 < high < 0.6, (low, high)
  path = str(tmp_path / "pass_at_k.png")
  assert evaluation.plot_comparison(reports, path, "run") == path and os.path.getsize(path)
  near_zero = evaluation.comparison_figure({"after RL": report(0.0, 0.01)}, "run")
  assert near_zero.axes[0].get_ylim()[0] == -0.02  # a rate's axis stays about [0, 1]


def test_the_end_of_a_run_is_a_few_short_lines():
  from launch import train

  summary = {  # summary.json of an SvS run: its per-step lists stay in the file
    "steps": 200,
    "eval_before_rl": {"heldout": {"pass@1": 0.481, "pass@4": 0.7}},
    "eval_after_rl": {"heldout": {"pass@1": 0.517, "pass@4": 0.72}},
    "time_s_this_invocation": 1234.5,
    "method": "svs",
    "model_dir": "/cache/tiny",
    "workdir": "/w",
    "synthetic_accepted_per_step": [3] * 200,
    "synthetic_accepted_mean": 3.0,
    "buffer_types_per_step": [{"type1": 10, "type2": 3, "type3": 3}] * 200,
  }
  assert train.summary_lines(summary, "/w") == [
    "RL: 200 steps of svs (1234 s in this invocation)",
    "heldout: pass@1 48.1% -> 51.7%, pass@4 70.0% -> 72.0% (before -> after RL)",
    "svs: synthetic_accepted_mean 3.0",
    "summary: /w/summary.json (all figures and per-step lists; plots: training.png, "
    "pass_at_k.png and the method's own .png beside it)",
  ]


def test_log_lines_and_stop_messages_print_above_the_progress_bar(capsys):
  import logging

  from tqdm import tqdm

  from rlvr.common import progress

  root, handler = logging.getLogger(), logging.StreamHandler(sys.stderr)
  root.addHandler(handler)
  try:
    bar = tqdm(total=4, desc="rlvr", file=sys.stderr, mininterval=0)
    bar.update(1)
    with progress.messages_above_bars():
      logging.getLogger("tensorboardX.x2num").warning("a library's warning")
    progress.say("SIGINT: finishing this RL step")
    bar.update(1)
    progress.close_bars()
    progress.say("stopped by SIGINT after RL step 2 of 4")
  finally:
    root.removeHandler(handler)
  assert root.handlers.count(handler) == 0
  screen = run_output.screen(capsys.readouterr().err)
  assert screen[:2] == ["a library's warning", "SIGINT: finishing this RL step"], screen
  assert screen[2].startswith("rlvr:  50%|") and screen[3:] == [
    "stopped by SIGINT after RL step 2 of 4",
    "",
  ], screen


def test_make_tiny_prints_no_library_notices(tmp_path):
  """As on a machine without torch (transformers' advisory) and without JAX_PLATFORMS
  (jax probing the TPU backend): only the launcher's own line is printed."""
  out = str(tmp_path / "tiny")
  hide_torch = (
    "import runpy, sys; sys.modules['torch'] = None; "
    f"sys.argv = ['make_tiny', '--out={out}']; "
    "runpy.run_module('launch.make_tiny', run_name='__main__')"
  )
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("JAX_PLATFORMS", "TRANSFORMERS_NO_ADVISORY_WARNINGS")
  }
  proc = subprocess.run(
    [sys.executable, "-c", hide_torch],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  text = proc.stdout + proc.stderr
  assert proc.returncode == 0, text
  assert "PyTorch was not found" not in text and "tpu" not in text.lower(), text
  assert f"parameters to {out}" in proc.stdout
