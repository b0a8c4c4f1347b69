"""What the embedded-scale studies share: one SFT warm start per seed, mean +- standard error."""

from __future__ import annotations

import json
import os
import shutil
import sys


def share_sft(src: str, dst: str) -> None:
  """Same SFT warm start and its evaluation for every arm of a seed: copied, not retrained."""
  if os.path.exists(os.path.join(dst, "sft", "model")):
    return
  os.makedirs(dst, exist_ok=True)
  shutil.copytree(os.path.join(src, "sft"), os.path.join(dst, "sft"))
  with open(os.path.join(src, "progress.json")) as f:
    before = json.load(f)["eval_before"]
  with open(os.path.join(dst, "progress.json"), "w") as f:
    json.dump({"eval_before": before}, f)


def run_arms(root: str, seeds, arms, train) -> dict:
  """rows[arm][seed] = train(workdir, arm, seed) under root/seed<S>/<arm>; every arm of a
  seed starts from the first arm's SFT warm start (`share_sft`)."""
  rows = {arm: {} for arm in arms}
  for seed in seeds:
    for arm in arms:
      workdir = os.path.join(root, f"seed{seed}", arm)
      if arm != arms[0]:
        share_sft(os.path.join(root, f"seed{seed}", arms[0]), workdir)
      rows[arm][seed] = train(workdir, arm, seed)
  return rows


def define_run_flags(steps: int, workdir: str) -> None:
  """The flags every paired study takes: --steps, --workdir, --seeds, --extra."""
  from absl import flags

  flags.DEFINE_integer("steps", steps, "GRPO steps of each run.")
  flags.DEFINE_string("workdir", workdir, "Where the runs go.")
  flags.DEFINE_list("seeds", ["0", "1"], "Run seeds; arms are paired by seed.")
  flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")


def train_command(config: str, workdir: str, steps: int, seed: int, *flags: str) -> list[str]:
  """The `launch.train` argv of one study run: `config` for `steps` GRPO steps with `seed`,
  no HF export, then `flags` (later flags win)."""
  return [
    sys.executable,
    "-m",
    "launch.train",
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.rl.steps={steps}",
    f"--config.seed={seed}",
    "--config.export_hf=False",
    *flags,
  ]


def mean_se(xs):
  """(mean, standard error) of the values that are not None; (None, None) for none."""
  xs = [x for x in xs if x is not None]
  if not xs:
    return None, None
  m = sum(xs) / len(xs)
  se = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5 if len(xs) > 1 else 0.0
  return m, se


def read_rows(workdir: str) -> list[dict]:
  """The SFT warm start's evaluation as step 0, then every RL step's metrics at step + 1."""
  with open(os.path.join(workdir, "progress.json")) as f:
    before = json.load(f)["eval_before"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  first = {"step": 0, **{f"{name}_{k}": v for name, r in before.items() for k, v in r.items()}}
  return [first] + [{**r, "step": r["step"] + 1} for r in rows]
