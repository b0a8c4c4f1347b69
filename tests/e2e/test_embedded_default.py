"""The README's main command (SvS at embedded scale), end to end, on fewer steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tiny_run
from paths import REPO


@pytest.mark.slow
def test_embedded_default_runs_end_to_end(tmp_path):
  workdir = tmp_path / "tiny"
  _, rows = tiny_run.train(
    workdir,
    "--config.sft.steps=60",
    "--config.rl.steps=3",
    "--config.data.arithmetic.n_heldout=64",
    "--config.checkpoint.every=2",
    config="configs/tiny.py",
    timeout=1200,
  )
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["steps"] == 3 and summary["method"] == "svs"
  assert len(summary["synthetic_accepted_per_step"]) == 3
  assert all(len(types) == 3 for types in summary["buffer_types_per_step"])
  for phase in ("eval_before_rl", "eval_after_rl"):
    assert 0.0 <= summary[phase]["heldout"]["pass@1"] <= 1.0
    assert summary[phase]["heldout"]["pass@1"] <= summary[phase]["heldout"]["pass@4"]
  assert [r["step"] for r in rows] == [0, 1, 2]
  for r in rows:  # every synthesis is accepted or rejected for exactly one reason
    assert r["svs_syntheses"] == (
      r["svs_accepted"] + r["svs_too_easy"] + r["svs_too_hard"] + r["svs_unparseable"]
    )
  assert summary["buffer_types_per_step"] == [
    {f"type{t}": r[f"type{t}_groups"] for t in (1, 2, 3)} for r in rows
  ]
  for name in (
    "training.png",
    "svs.png",
    "eval_before_rl/eval.md",
    "eval_after_rl/pass_at_k.png",
    "eval_after_rl/eval.csv",
    "pass_at_k.png",
    "policy/config.json",
    "policy/model.safetensors",
    "sft/model/config.json",
    "sft/metrics.jsonl",
  ):
    assert (workdir / name).exists(), name
  assert any(f.startswith("events") for f in os.listdir(workdir / "tensorboard"))
  # The exported policy is an HF checkpoint transformers can load.
  from transformers import AutoModelForCausalLM

  AutoModelForCausalLM.from_pretrained(workdir / "policy")
  # The finished run evaluated again on its own held-out set and settings (command in docs/launch.md).
  again = subprocess.run(
    [sys.executable, "-m", "launch.evaluate", f"--run={workdir}", "--limit=16"],
    cwd=REPO,
    env=tiny_run.env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert again.returncode == 0, again.stderr[-3000:]
  report = json.loads((workdir / "eval_again" / "eval.json").read_text())
  assert report["heldout"]["problems"] == 16 and report["heldout"]["n"] == 4
  assert "| heldout |" in again.stdout
