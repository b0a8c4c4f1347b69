"""The README's "Set up and run" on a fresh machine, and the main job's figures checked
against the code that computes them.

A `git clone` holds only committed files (nothing untracked, ignored or built here, no
development folder beside it); `bash scripts/setup.sh` makes its .venv from requirements.lock,
and the README's main command (SvS at embedded scale) runs from that venv end to end, scaled
down by flags, with HOME (so the tiny-model and HF caches) in the test's temporary directory.
The run is hashed: where docs/results.md has a row for this CPU kind, the hash recorded beside
it must be this one, or the row's figures are stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import test_readme_commands as readme_lib
import tiny_run
from paths import REPO

RESULTS = os.path.join(REPO, "docs", "results.md")
# The main command, scaled down: 60 SFT steps (fewer leave no mixed group for the SvS steps),
# 3 SvS steps, 64 held-out problems. docs/results.md's fingerprints are of this run.
SCALE_DOWN = [
  "--config.sft.steps=60",
  "--config.rl.steps=3",
  "--config.data.arithmetic.n_heldout=64",
  "--config.checkpoint.every=2",
]

# Nothing of this checkout or of the caller's caches reaches the clone's processes.
DROPPED = (
  "PYTHONPATH",
  "VIRTUAL_ENV",
  "XLA_FLAGS",
  "HF_HOME",
  "HF_HUB_CACHE",
  "TRANSFORMERS_CACHE",
  "XDG_CACHE_HOME",
  "JAX_COMPILATION_CACHE_DIR",
)


def _run(cmd, cwd, env, timeout):
  t0 = time.time()
  p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  seconds = time.time() - t0
  print(f"\n$ {' '.join(map(str, cmd))}\n  ({seconds:.1f}s, exit {p.returncode})")
  assert p.returncode == 0, f"{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
  return p, seconds


def _main_commands(readme: str) -> tuple[str, str]:
  """The installer and the main command of the README's "Set up and run" section."""
  section = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
  commands = readme_lib.readme_commands(readme)
  main = next(c for c in commands if c.startswith(".venv/bin/python -m launch.train"))
  assert "bash scripts/setup.sh" in commands and f"bash scripts/setup.sh && {main}" in section
  return "bash scripts/setup.sh", main


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
def test_readme_setup_and_main_command_in_a_fresh_clone(tmp_path):
  clone, home = tmp_path / "repo", tmp_path / "home"
  home.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in DROPPED}
  env.update(HOME=str(home), JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  try:
    _, t_clone = _run(["git", "clone", "-q", REPO, str(clone)], tmp_path, env, 120)
    # Nothing committed points to a folder beside the checkout (the development machines').
    beside = os.path.join("..", "shared")
    grep = subprocess.run(
      ["git", "grep", "-n", "-F", beside], cwd=clone, capture_output=True, text=True
    )
    assert grep.returncode == 1 and not grep.stdout, grep.stdout

    # The clone's README says what to run.
    setup, main = _main_commands((clone / "README.md").read_text())
    installed, t_setup = _run(setup.split(), clone, env, 900)
    noise = [
      line
      for line in (installed.stdout + installed.stderr).splitlines()
      if "setuptools" in line or "Editable" in line
    ]
    assert not noise, installed.stderr[-3000:]  # no build backend's warning block
    where, _ = _run([".venv/bin/python", "-c", "import rlvr; print(rlvr.__file__)"], clone, env, 60)
    assert where.stdout.strip() == str(clone / "rlvr" / "__init__.py")

    workdir = tmp_path / "run"
    cmd = [*main.split(), f"--workdir={workdir}", *SCALE_DOWN]
    out, t_run = _run(cmd, clone, env, 1200)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["model_dir"].startswith(str(home)), summary["model_dir"]  # HOME's cache
    assert f"summary: {workdir}/summary.json" in out.stdout
    print(f"fresh clone: clone {t_clone:.1f}s, setup.sh {t_setup:.1f}s, main command {t_run:.1f}s")
  finally:
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # 1.3 GB
  _check_fingerprint(workdir)
  _check_main_job(workdir, summary)


def _check_fingerprint(workdir):
  """The main job's figures in docs/results.md are true of this code: where the table has a
  row for this CPU kind, the same scaled-down run gave the fingerprint recorded beside it."""
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


def _check_main_job(workdir, summary):
  """What the main command writes: SvS steps whose syntheses add up, evaluations, plots,
  TensorBoard events, an HF policy transformers loads, and a run `launch.evaluate --run`
  evaluates again."""
  rows = tiny_run.rows(workdir / "metrics.jsonl")
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
