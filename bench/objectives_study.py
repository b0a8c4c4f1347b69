r"""Study: SvS and plain RLVR with each objective (GRPO, GSPO, REINFORCE++), paired by seed.

  python bench/objectives_study.py [--steps=60] [--seeds=0,1] [--objectives=grpo,gspo,reinforce++]

Every arm is the embedded default (configs/tiny.py) with `method` (svs or rlvr) and one
objective's settings (OBJECTIVES); the arms of a seed share its SFT warm start
(`study_utils.run_arms`). Prints and writes to study.json, per arm, the final held-out
pass@1 / pass@8 (mean +- standard error over seeds) and the paired differences of final
pass@1: SvS minus RLVR for each objective, and each objective minus GRPO within a method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_utils import mean_se, read_rows, run_arms  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 60, "GRPO steps of each run.")
flags.DEFINE_integer("eval_every", 20, "Held-out evaluation interval (steps).")
flags.DEFINE_string("workdir", "workdir/objectives_study", "Where the runs go.")
flags.DEFINE_list("seeds", ["0", "1"], "Run seeds; arms are paired by seed.")
flags.DEFINE_list("objectives", ["grpo", "gspo", "reinforce++"], "Objectives (OBJECTIVES keys).")
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")

METHODS = ("rlvr", "svs")
OBJECTIVES = {
  "grpo": [],
  # the GSPO paper's objective: the mean over sequences, its narrow clip range (v2)
  "gspo": [
    "--config.rl.learner.policy_loss=gspo",
    "--config.rl.learner.aggregation=seq-mean-token-mean",
    "--config.rl.learner.eps_low=3e-4",
    "--config.rl.learner.eps_high=4e-4",
  ],
  # REINFORCE++ as verl runs it: the clipped surrogate on batch-whitened advantages
  "reinforce++": ["--config.rl.learner.advantage=reinforce++"],
}


def _train(workdir, arm, seed):
  method, objective = arm.split("+", 1)
  cmd = [
    sys.executable,
    "-m",
    "launch.train",
    "--config=configs/tiny.py",
    f"--workdir={workdir}",
    f"--config.rl.steps={FLAGS.steps}",
    f"--config.seed={seed}",
    f"--config.eval.every={FLAGS.eval_every}",
    "--config.eval.sampling.n=8",
    f"--config.method={method}",
    *OBJECTIVES[objective],
    *FLAGS.extra,
  ]
  subprocess.run(cmd, cwd=REPO, check=True)
  return read_rows(workdir)


def _final(rows, key):
  """The last evaluation's value of `key`; None when no evaluation measured it."""
  return next((r[key] for r in reversed(rows) if key in r), None)


def _cell(m, se, sign=""):
  return "-" if m is None else f"{100 * m:{sign}.1f} ± {100 * se:.1f}"


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.objectives) - set(OBJECTIVES))
  if unknown:
    raise app.UsageError(f"--objectives: unknown {unknown}; expected some of {sorted(OBJECTIVES)}")
  seeds = [int(s) for s in FLAGS.seeds]
  arms = [f"{m}+{o}" for o in FLAGS.objectives for m in METHODS]
  rows = run_arms(os.path.abspath(FLAGS.workdir), seeds, arms, _train)
  final = {
    arm: {
      s: {k: _final(rows[arm][s], k) for k in ("heldout_pass@1", "heldout_pass@8")} for s in seeds
    }
    for arm in arms
  }
  summary = {"seeds": seeds, "steps": FLAGS.steps, "arms": {}, "paired": {}}
  lines = ["| arm | final pass@1 | final pass@8 |", "|---|---|---|"]
  for arm in arms:
    cells = {
      k: mean_se([final[arm][s][k] for s in seeds]) for k in ("heldout_pass@1", "heldout_pass@8")
    }
    summary["arms"][arm] = {"per_seed": final[arm], **{f"{k}_mean_se": v for k, v in cells.items()}}
    lines.append(f"| {arm} | " + " | ".join(_cell(m, se) for m, se in cells.values()) + " |")
  pairs = [(f"svs+{o}", f"rlvr+{o}") for o in FLAGS.objectives]
  pairs += [(f"{m}+{o}", f"{m}+grpo") for m in METHODS for o in FLAGS.objectives if o != "grpo"]
  lines += ["", "| paired difference of final pass@1 | mean ± s.e. (points) |", "|---|---|"]
  for a, b in pairs:
    if a in final and b in final:
      d = mean_se([final[a][s]["heldout_pass@1"] - final[b][s]["heldout_pass@1"] for s in seeds])
      summary["paired"][f"{a} - {b}"] = d
      lines.append(f"| {a} - {b} | {_cell(*d, sign='+')} |")
  summary["table"] = "\n".join(lines)
  with open(os.path.join(os.path.abspath(FLAGS.workdir), "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])


if __name__ == "__main__":
  app.run(main)
