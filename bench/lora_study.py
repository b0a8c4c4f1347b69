r"""Study: LoRA against full fine-tuning in RL at embedded scale, paired by seed.

  python bench/lora_study.py [--steps=100] [--seeds=0,1]

Both arms start from the same SFT warm start per seed (configs/tiny_rlvr.py's, trained
once and copied): "full" is configs/tiny_rlvr.py (GRPO on every weight), "lora" is
configs/tiny_rlvr_lora.py (rank-16 adapters on the frozen SFT model, 10x the learning
rate). Prints and writes to study.json, per arm, held-out pass@1 before and after RL (mean
+- standard error over seeds), the mean update and step times, and the paired difference
of final pass@1 (lora minus full).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_utils import define_run_flags, mean_se, run_arms, train_command  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
define_run_flags(steps=100, workdir="workdir/lora_study")

ARMS = {"full": "configs/tiny_rlvr.py", "lora": "configs/tiny_rlvr_lora.py"}


def _train(workdir: str, arm: str, seed: int) -> dict:
  cmd = train_command(ARMS[arm], workdir, FLAGS.steps, seed, *FLAGS.extra)
  subprocess.run(cmd, cwd=REPO, check=True)
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f][1:]  # step 0 compiles
  mean = lambda k: sum(r[k] for r in rows) / max(len(rows), 1)
  return {
    "before": summary["eval_before_rl"]["heldout"]["pass@1"],
    "after": summary["eval_after_rl"]["heldout"]["pass@1"],
    "time_update": mean("time_update"),
    "time_step": mean("time_step"),
  }


def main(argv):
  del argv
  seeds = [int(s) for s in FLAGS.seeds]
  root = os.path.abspath(FLAGS.workdir)
  rows = run_arms(root, seeds, list(ARMS), _train)
  cell = lambda m, se, sign="": f"{100 * m:{sign}.1f} ± {100 * se:.1f}"
  lines = [
    "| arm | pass@1 before RL | pass@1 after RL | update s/step | step s |",
    "|---|---|---|---|---|",
  ]
  for arm in ARMS:
    r = [rows[arm][s] for s in seeds]
    before, after = mean_se([x["before"] for x in r]), mean_se([x["after"] for x in r])
    upd, step = mean_se([x["time_update"] for x in r]), mean_se([x["time_step"] for x in r])
    lines.append(f"| {arm} | {cell(*before)} | {cell(*after)} | {upd[0]:.3f} | {step[0]:.2f} |")
  d = mean_se([rows["lora"][s]["after"] - rows["full"][s]["after"] for s in seeds])
  lines += ["", f"paired difference of pass@1 after RL, lora - full: {cell(*d, sign='+')} points"]
  per_seed = [
    f"seed {s}: full {100 * rows['full'][s]['before']:.1f} -> {100 * rows['full'][s]['after']:.1f}"
    f", lora {100 * rows['lora'][s]['before']:.1f} -> {100 * rows['lora'][s]['after']:.1f}"
    for s in seeds
  ]
  lines += per_seed
  summary = {"seeds": seeds, "steps": FLAGS.steps, "arms": rows, "paired_after": d}
  summary["table"] = "\n".join(lines)
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])


if __name__ == "__main__":
  app.run(main)
