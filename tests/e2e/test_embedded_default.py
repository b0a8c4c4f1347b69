"""The README's main command (SvS at embedded scale), end to end, on fewer steps; and the
check that the main job's figures in docs/results.md are those of the code as it is."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import tiny_run
from paths import REPO

RESULTS = os.path.join(REPO, "docs", "results.md")


def this_cpu() -> str:
  """This machine as docs/results.md names a row's machine: `lscpu`'s vendor, family and
  model, and the cores JAX computes on (floats differ between CPU kinds, and may with the
  number of threads XLA splits a reduction over)."""
  with open("/proc/cpuinfo") as f:
    info = dict(
      (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in f) if v.strip()
    )
  family, model = info.get("cpu family", "?"), info.get("model", "?")
  return f"{info.get('vendor_id', '?')} family {family} model {model}, {os.cpu_count()} cores"


def fingerprint(workdir) -> str:
  """12 hex digits of the scaled-down run's numbers: its SFT and RL metrics (timings aside)
  and its evaluations. The same code on the same CPU kind gives the same digits."""
  sft = tiny_run.rows(os.path.join(workdir, "sft", "metrics.jsonl"))
  rl = tiny_run.rows(os.path.join(workdir, "metrics.jsonl"))
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  evals = {k: v for k, v in summary.items() if k.startswith("eval_")}
  text = json.dumps([sft, rl, evals], sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def recorded_fingerprints() -> dict[str, str]:
  """{machine: fingerprint} from docs/results.md's table of the trees behind the main job's
  rows."""
  with open(RESULTS) as f:
    text = f.read()
  return dict(re.findall(r"^\| `([^`]+ cores)` \| `([0-9a-f]{12})` \|", text, re.M))


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
  # The main job's figures in docs/results.md are true of this code: where the table has a
  # row for this CPU kind, the same scaled-down run gave the fingerprint recorded beside it.
  found, machine = fingerprint(workdir), this_cpu()
  recorded = recorded_fingerprints()
  assert recorded, "docs/results.md: no fingerprints of the main job's rows"
  if machine in recorded:
    assert found == recorded[machine], (
      f"The main job computes differently on `{machine}`: this scaled-down run's "
      f"fingerprint is {found}, docs/results.md's row says {recorded[machine]}. Its figures "
      "are stale: rerun `python -m launch.train --config=configs/tiny.py` here, put its "
      "figures in the row, and this fingerprint beside it."
    )
  else:
    print(f"no main-job row for `{machine}` in docs/results.md; its fingerprint: {found}")
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
