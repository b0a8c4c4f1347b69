r"""Study: Composition-RL's depth curriculum vs plain GRPO on depth 1, at embedded scale.

  python bench/composition_study.py [--steps=60] [--eval_every=20] [--seeds=0]

configs/tiny_composition.py (arithmetic composed by construction, depths 1-3) from
one SFT warm start per seed, then the same number of GRPO steps (one optimizer step
each) two ways: `depth1` trains on depth-1 problems only (plain GRPO with dynamic
sampling: the curriculum with one stage), `curriculum` spends a third of the steps
on each of depths 1, 2, 3 (fixed switch points, so both arms make the same updates).
Held-out pass@1 on depth-1, -2 and -3 problems every --eval_every steps; the table
gives mean +- standard error over seeds, study.json the paired differences.
Writes composition_study.png and study.json under --workdir.
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
flags.DEFINE_integer("steps", 60, "GRPO steps of each arm (a multiple of 3).")
flags.DEFINE_integer("eval_every", 20, "Held-out evaluation interval (steps).")
flags.DEFINE_string("workdir", "workdir/composition_study", "Where the runs go.")
flags.DEFINE_list("seeds", ["0"], "Run seeds (data, SFT, sampling); arms are paired by seed.")
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")

DEPTHS = (1, 2, 3)
ARMS = ("depth1", "curriculum")


def _arm_flags(arm: str) -> list[str]:
  if arm == "depth1":
    return ["--config.composition.depths=(1,)"]
  return [
    "--config.composition.depths=(1, 2, 3)",
    f"--config.composition.max_steps={FLAGS.steps // 3}",
    "--config.composition.solve_all_threshold=0.0",
  ]


def _train(workdir: str, arm: str, seed: int) -> list[dict]:
  cmd = [
    sys.executable,
    "-m",
    "launch.train",
    "--config=configs/tiny_composition.py",
    f"--workdir={workdir}",
    f"--config.rl.steps={FLAGS.steps}",
    f"--config.seed={seed}",
    f"--config.eval.every={FLAGS.eval_every}",
    *_arm_flags(arm),
    *FLAGS.extra,
  ]
  subprocess.run(cmd, cwd=REPO, check=True)
  return read_rows(workdir)


def _evals(rows: list[dict], depth: int) -> list[tuple[int, float]]:
  key = f"heldout_d{depth}_pass@1"
  return [(r["step"], r[key]) for r in rows if key in r]


def main(argv):
  del argv
  if FLAGS.steps % 3:
    raise app.UsageError(f"--steps: a multiple of 3 (three equal stages), got {FLAGS.steps}")
  root = os.path.abspath(FLAGS.workdir)
  seeds = [int(s) for s in FLAGS.seeds]
  rows = run_arms(root, seeds, ARMS, _train)

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(DEPTHS) + 1, figsize=(4.2 * (len(DEPTHS) + 1), 3.2))
  for ax, depth in zip(axes, DEPTHS):
    for arm in ARMS:
      per_seed = [_evals(rows[arm][s], depth) for s in seeds]
      steps = [st for st, _ in per_seed[0]]
      ax.plot(
        steps,
        [100 * sum(ps[i][1] for ps in per_seed) / len(seeds) for i in range(len(steps))],
        marker=".",
        label=arm,
      )
    ax.set_title(f"held-out pass@1, depth {depth} (%)")
  for arm in ARMS:  # the depth each arm trained on, step by step (first seed)
    axes[-1].step(
      [r["step"] for r in rows[arm][seeds[0]][1:]],
      [r["depth"] for r in rows[arm][seeds[0]][1:]],
      label=arm,
      where="post",
    )
  axes[-1].set_title("training depth")
  for ax in axes:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(root, "composition_study.png"), dpi=110)

  final = {
    arm: {s: {d: _evals(rows[arm][s], d)[-1][1] for d in DEPTHS} for s in seeds} for arm in ARMS
  }
  start = {s: {d: _evals(rows[ARMS[0]][s], d)[0][1] for d in DEPTHS} for s in seeds}
  lines = [
    "| arm | " + " | ".join(f"depth {d} pass@1" for d in DEPTHS) + " |",
    "|---|" + "---|" * len(DEPTHS),
  ]
  cells = lambda per: " | ".join(
    "{:.1f}±{:.1f}".format(*(100 * x for x in mean_se([per[s][d] for s in seeds]))) for d in DEPTHS
  )
  lines.append(f"| SFT (step 0) | {cells(start)} |")
  for arm in ARMS:
    lines.append(f"| {arm} (step {FLAGS.steps}) | {cells(final[arm])} |")
  summary = {
    "seeds": seeds,
    "steps": FLAGS.steps,
    "sft_pass@1": start,
    "final_pass@1": final,
    "curriculum_minus_depth1_mean_se": {
      d: mean_se([final["curriculum"][s][d] - final["depth1"][s][d] for s in seeds]) for d in DEPTHS
    },
    "table": "\n".join(lines),
  }
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])
  print(json.dumps(summary["curriculum_minus_depth1_mean_se"]))
  print(f"plot: {os.path.join(root, 'composition_study.png')}")


if __name__ == "__main__":
  app.run(main)
