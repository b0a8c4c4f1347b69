"""The README's "Set up and run" on a fresh machine: a clean clone, `scripts/setup.sh`, the
main command.

A `git clone` holds only committed files (nothing untracked, ignored or built here, no
development folder beside it); `bash scripts/setup.sh` makes its .venv from requirements.lock,
and the README's main command runs from that venv, scaled down by flags, with HOME (so the
tiny-model and HF caches) in the test's temporary directory. About 100 s on 2 CPU cores:
the clone 0.1 s, setup.sh 45 s (pip installs from its index; nothing cached between runs),
the run 55 s (SFT 60 steps 22 s, one SvS step 23 s, most of it compiling).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
import test_readme_commands as readme_lib
from paths import REPO

# The main command, scaled down: SFT as long as tests/e2e/test_embedded_default.py (fewer steps
# leave no mixed group for the SvS step), one RL step, 16 held-out problems.
SCALE_DOWN = [
  "--config.sft.steps=60",
  "--config.rl.steps=1",
  "--config.data.arithmetic.n_heldout=16",
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
    out, t_run = _run(cmd, clone, env, 900)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["method"] == "svs", summary
    assert summary["model_dir"].startswith(str(home)), summary["model_dir"]  # HOME's cache
    assert f"summary: {workdir}/summary.json" in out.stdout
    print(f"fresh clone: clone {t_clone:.1f}s, setup.sh {t_setup:.1f}s, main command {t_run:.1f}s")
  finally:
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # 1.3 GB
