r"""Study: QbQ's seed band and its curriculum, at embedded scale.

  python bench/qbq_study.py [--rounds=6] [--seeds=0]

configs/tiny_qbq.py (arithmetic, procedural teacher) from one SFT warm start per
seed, the same number of GRPO steps (rounds x steps_per_round) three ways:
  mostly     the method: seeds from the mostly-right band (k/2..k-1 of k);
  sometimes  seeds from the sometimes-right band (1..k/2-1), the paper's "harder" arm;
  shuffled   no curriculum: the mostly arm's selections of every round, shuffled into
             one pass from the warm start (the paper's non-curriculum QbQ).
Held-out pass@1 after every round; the table gives mean +- standard error over
seeds. Writes qbq_study.png and study.json under --workdir.
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
flags.DEFINE_integer("rounds", 6, "QbQ rounds of every arm.")
flags.DEFINE_integer("steps_per_round", 8, "GRPO steps per round.")
flags.DEFINE_string("workdir", "workdir/qbq_study", "Where the runs go.")
flags.DEFINE_list("seeds", ["0"], "Run seeds (data, SFT, sampling); arms are paired by seed.")
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")

ARMS = ("mostly", "sometimes", "shuffled")


def _arm_flags(arm: str, seed_dir: str) -> list[str]:
  if arm == "shuffled":
    return [
      "--config.qbq.schedule=shuffled",
      f"--config.qbq.replay_from={os.path.join(seed_dir, 'mostly')}",
    ]
  return [f"--config.qbq.seed_band={arm}"]


def _train(workdir: str, arm: str, seed: int) -> list[dict]:
  steps = FLAGS.rounds * FLAGS.steps_per_round
  cmd = [
    sys.executable,
    "-m",
    "launch.train",
    "--config=configs/tiny_qbq.py",
    f"--workdir={workdir}",
    f"--config.seed={seed}",
    f"--config.rl.steps={steps}",
    f"--config.qbq.rounds={FLAGS.rounds}",
    f"--config.qbq.steps_per_round={FLAGS.steps_per_round}",
    f"--config.eval.every={FLAGS.steps_per_round}",
    "--config.export_hf=False",
    *_arm_flags(arm, os.path.dirname(workdir)),
    *FLAGS.extra,
  ]
  subprocess.run(cmd, cwd=REPO, check=True)
  return read_rows(workdir)


def _curve(rows: list[dict]) -> list[tuple[int, float]]:
  return [(r["step"], r["heldout_pass@1"]) for r in rows if "heldout_pass@1" in r]


def _rounds(workdir: str) -> list[dict]:
  out = []
  for t in range(FLAGS.rounds):
    path = os.path.join(workdir, "qbq", f"round_{t:02d}", "round.jsonl")
    if os.path.exists(path):
      with open(path) as f:
        out.append(json.loads(f.readline()))
  return out


def main(argv):
  del argv
  root = os.path.abspath(FLAGS.workdir)
  seeds = [int(s) for s in FLAGS.seeds]
  rows = run_arms(root, seeds, ARMS, _train)

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for arm in ARMS:
    curves = [_curve(rows[arm][s]) for s in seeds]
    steps = [st for st, _ in curves[0]]
    ax.plot(
      steps,
      [100 * sum(c[i][1] for c in curves) / len(seeds) for i in range(len(steps))],
      marker="o",
      label=arm,
    )
  ax.set_xlabel("GRPO step (a marker per round)")
  ax.set_title("held-out pass@1 (%)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(root, "qbq_study.png"), dpi=110)

  final = {arm: {s: _curve(rows[arm][s])[-1][1] for s in seeds} for arm in ARMS}
  start = {s: _curve(rows[ARMS[0]][s])[0][1] for s in seeds}
  cell = lambda xs: "{:.1f}±{:.1f}".format(*(100 * x for x in mean_se(xs)))
  lines = [
    "| arm | held-out pass@1 | selected per round | eligible (1..k-1) per round |",
    "|---|---|---|---|",
    f"| SFT (step 0) | {cell(list(start.values()))} | | |",
  ]
  for arm in ARMS:
    per_round = [r for s in seeds for r in _rounds(os.path.join(root, f"seed{s}", arm))]
    sel = sum(r["selected"] for r in per_round) / max(len(per_round), 1)
    elig = sum(r["eligible"] for r in per_round) / max(len(per_round), 1)
    lines.append(
      f"| {arm} | {cell(list(final[arm].values()))} | {sel:.1f} | {elig:.1f} |"
      if per_round
      else f"| {arm} | {cell(list(final[arm].values()))} | (replay) | |"
    )
  summary = {
    "seeds": seeds,
    "rounds": FLAGS.rounds,
    "steps_per_round": FLAGS.steps_per_round,
    "sft_pass@1": start,
    "final_pass@1": final,
    "curves": {arm: {s: _curve(rows[arm][s]) for s in seeds} for arm in ARMS},
    "minus_mostly_mean_se": {
      arm: mean_se([final[arm][s] - final["mostly"][s] for s in seeds]) for arm in ARMS[1:]
    },
    "table": "\n".join(lines),
  }
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])
  print(f"plot: {os.path.join(root, 'qbq_study.png')}")


if __name__ == "__main__":
  app.run(main)
