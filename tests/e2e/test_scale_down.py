"""Every shipped paper config, scaled down by configs/cpu.py, runs two RL steps on this CPU:
same method and settings path, in-process sampler, a small SFT'd model, data from files.
The synthesis methods' runs (SvS, Composition-RL, QbQ) sample one step off-policy
(rl.loop.max_staleness=1): their step 1 trains on a buffer built from step 0's weights."""

from __future__ import annotations

import json
import os

import pytest
from paths import REPO

from rlvr.report import metrics
from rlvr.run import runner

PAPER = sorted(
  f[:-3]
  for f in os.listdir(os.path.join(REPO, "configs"))
  if f.startswith(("rlvr_", "svs_", "composition_", "qbq_", "torl_"))
  and f != "svs_ablations.py"
  and "primerl" not in f  # code configs: tests/e2e/test_code_domain.py, with a code policy
)


def _configured(name: str, policy_dir: str, data_files: dict, workdir: str):
  """The paper config `name` scaled down by configs/cpu.py, with this file's policy, data
  and settings."""
  from configs import cpu

  c = cpu.get_config(name)
  assert c.rl.steps == 2 and c.sampler.kind == "jax" and c.mesh.fsdp == -1
  c.workdir = workdir
  c.model.path = policy_dir
  # Depth-2 problems only where the method composes: the small policy seldom solves them,
  # and a step whose 4 prompts it all fails has nothing to learn from.
  train = "train" if c.method == "composition" else "train_d1"
  c.data.train_path, c.data.extra_train_paths = data_files[train], []
  c.data.eval_paths = [data_files["heldout"]]
  c.data.instruction = ""  # the SFT'd policy's prompt format (its chat template, no
  c.data.chat_template = ""  # instruction; ToRL's base-model config renders none)
  c.reward.integer_answers = True
  c.composition.depths = (1, 2)
  c.qbq.integer_answers = True
  c.qbq.teacher = "procedural"  # exact variants of "Compute ..." problems
  c.qbq.seed_band = "mixed"  # the small policy seldom solves 2 of 4
  if c.method == "svs":  # SvS samples each prompt once a step: twice the prompts, so a
    c.rl.loop.prompts_per_step = 8  # step holds some group the small policy half solves
  c.rl.loop.max_staleness = int(c.method != "rlvr")
  return c


def _scaled(name: str) -> str:
  """The run this file makes of a paper config, as JSON: configs that differ only in what
  it replaces (the model's size, the data, reward.integer_answers) make the same run."""
  files = {k: k for k in ("train", "train_d1", "heldout")}
  c = _configured(name, "policy", files, "workdir").to_dict()
  return json.dumps(c, sort_keys=True, default=str)


SCALED = {name: _scaled(name) for name in PAPER}
# One test per distinct run (the first config name of each).
DISTINCT = sorted({s: n for n, s in sorted(SCALED.items(), reverse=True)}.values())


def test_every_paper_config_scales_down_to_a_run_this_file_makes():
  assert set(SCALED.values()) == {SCALED[n] for n in DISTINCT}
  assert len(DISTINCT) >= 6  # the papers' settings really differ


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
  """Train and eval files a user could have written: arithmetic problems of depth 1 and 2
  (Composition-RL's `composed-d<K>` sources), one JSON object a line."""
  from rlvr.data.tasks import composed

  root = tmp_path_factory.mktemp("data")
  paths = {}
  for split, n in (("train", 64), ("heldout", 8)):
    rows = []
    for depth in (1, 2):
      train, held = composed.make_composed_splits(n, n, depth, seed=1)
      rows += [
        {"problem": p.problem, "answer": p.answer, "data_source": f"composed-d{depth}"}
        for p in (train if split == "train" else held)
      ]
    for name, kept in ((split, rows), (f"{split}_d1", rows[:n])):
      paths[name] = str(root / f"{name}.jsonl")
      with open(paths[name], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
  return paths


@pytest.mark.parametrize("name", DISTINCT)
def test_a_paper_config_scaled_down_runs_two_steps(name, arithmetic_policy, data_files, tmp_path):
  policy_dir, _ = arithmetic_policy
  c = _configured(name, policy_dir, data_files, str(tmp_path / name))
  ahead = c.rl.loop.max_staleness == 1
  summary = runner.run(c)
  rows = metrics.read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1]
  for r in rows:  # an update's samples are as old as the setting says
    if not r.get("skipped_update"):
      assert r["staleness_max"] == int(ahead and r["step"] > 0), r["step"]
  assert sum(1 - r.get("skipped_update", 0) for r in rows) >= 1
  assert set(summary["eval_after_rl"]) == {"heldout"}
  assert os.path.exists(os.path.join(c.workdir, "policy", "config.json"))
