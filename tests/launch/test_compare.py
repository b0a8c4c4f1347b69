"""launch.compare on two hand-written run dirs: one PNG of both runs' curves and a table of
their final figures; a key one run lacks is a note, a dir without metrics a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from paths import REPO
from PIL import Image

from rlvr.report import compare


def _write_run(path, rows, summary=None, progress=None):
  path.mkdir(parents=True)
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if summary is not None:
    (path / "summary.json").write_text(json.dumps(summary))
  if progress is not None:
    (path / "progress.json").write_text(json.dumps(progress))


@pytest.fixture
def two_runs(tmp_path):
  """grpo: 30 steps, finished (summary.json); svs: 4 steps, still going (progress.json, an
  eval.every row), no response lengths logged."""
  grpo = [
    {
      "step": s,
      "reward_mean": 0.3 + 0.01 * s,
      "entropy": 2.0 - 0.02 * s,
      "response_len_mean": 20.0 + s,
      "note": "text",
    }
    for s in range(30)
  ]
  _write_run(
    tmp_path / "grpo",
    grpo,
    summary={
      "steps": 30,
      "eval_before_rl": {"heldout": {"pass@1": 0.40, "pass@4": 0.6}},
      "eval_after_rl": {"heldout": {"pass@1": 0.475, "pass@4": 0.65}},
    },
  )
  svs = [{"step": s, "reward_mean": 0.5, "entropy": 1.25} for s in range(4)]
  svs[1]["heldout_pass@1"] = 0.4375
  _write_run(
    tmp_path / "svs", svs, progress={"eval_before": {"heldout": {"pass@1": 0.40, "pass@4": 0.6}}}
  )
  return tmp_path / "grpo", tmp_path / "svs"


def test_two_runs_give_one_png_and_a_table_of_final_figures(two_runs, tmp_path):
  grpo, svs = two_runs
  out = tmp_path / "figs" / "compare.png"
  res = subprocess.run(
    [sys.executable, "-m", "launch.compare", f"--runs={grpo},{svs}", f"--out={out}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert res.returncode == 0, res.stderr[-2000:]
  with Image.open(out) as im:  # 2 x 2 panels of 5 x 3.4 inches at 100 dpi
    im.verify()
  with Image.open(out) as im:
    assert im.format == "PNG" and im.size == (1000, 680)
  lines = res.stdout.splitlines()
  assert "note: svs: no 'response_len_mean' in its metrics.jsonl; left out of that panel" in lines
  table = [[c.strip() for c in l.strip("|").split("|")] for l in lines if l.startswith("| ")]
  assert table[0] == [
    "run",
    "RL steps",
    "reward_mean",
    "entropy",
    "response_len_mean",
    "heldout pass@1 before RL",
    "heldout pass@1 after RL",
  ]
  assert table[1] == ["grpo", "30", "0.59", "1.42", "49", "40.0%", "47.5%"]
  assert table[2] == ["svs", "4", "0.5", "1.25", "-", "40.0%", "43.8% (step 2)"]
  assert lines[-1] == f"wrote {out}"


def test_keys_no_run_has_are_noted_with_close_names(two_runs, tmp_path):
  res = compare.compare(two_runs, ["reward_mean", "entorpy"], out=str(tmp_path / "c.png"))
  assert res.notes == ["note: no run has 'entorpy'; no panel for it (close: entropy)"]
  assert res.table.splitlines()[0].split("|")[1:-1] == [" run  ", " RL steps ", " reward_mean "]
  with Image.open(tmp_path / "c.png") as im:  # one panel
    assert im.size == (500, 340)


def test_runs_of_the_same_name_are_told_apart(tmp_path):
  for seed in ("seed0", "seed1"):
    _write_run(tmp_path / seed / "run", [{"step": 0, "reward_mean": 0.5}])
  res = compare.compare([tmp_path / "seed0" / "run", tmp_path / "seed1" / "run"], out=None)
  assert [r.name for r in res.runs] == ["seed0/run", "seed1/run"]


def test_a_dir_without_metrics_is_a_one_line_error_naming_it(two_runs, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  res = subprocess.run(
    [sys.executable, "-m", "launch.compare", f"--runs={two_runs[0]},{empty}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert res.returncode == 1
  assert res.stderr.strip() == (
    f"launch.compare: {empty}: no metrics.jsonl (not a run's work dir, or no RL step has "
    "been logged yet)"
  )
  with pytest.raises(FileNotFoundError, match=r"/nowhere: no such run directory$"):
    compare.compare([two_runs[0], tmp_path / "nowhere"])
