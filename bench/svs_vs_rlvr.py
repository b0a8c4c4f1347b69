r"""Study: the embedded default trained twice, plain RLVR and SvS, same seeds and steps.

  python bench/svs_vs_rlvr.py [--steps=60] [--eval_every=10] [--arms=rlvr,svs,eup] [--seeds=0,1]

Both runs start from the same SFT warm start (worked solutions + inverse pairs,
configs/tiny.py) and differ only in `method`. Held-out pass@1 / pass@8 are
measured every --eval_every steps. With several --seeds every arm runs once per
seed (arms paired by seed: same data split and SFT); the table gives mean +-
standard error over seeds, and study.json the paired difference of final pass@1
to the first arm. Writes study.png (entropy, pass@1, pass@8, synthetic problems
accepted per step, means over seeds) and study.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_utils import mean_se, read_rows, share_sft  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 60, "GRPO steps of each run.")
flags.DEFINE_integer("eval_every", 10, "Held-out evaluation interval (steps).")
flags.DEFINE_string("workdir", "workdir/study", "Where the runs go.")
flags.DEFINE_list(
  "arms",
  ["svs", "rlvr"],
  "Runs to compare: svs, rlvr, eup (SvS's ablation: "
  "a second rollout on underperforming problems instead of synthesis).",
)
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")
flags.DEFINE_list("seeds", ["0"], "Run seeds (data split, SFT, sampling); arms are paired by seed.")

ARMS = {
  "svs": ["--config.method=svs"],
  "rlvr": ["--config.method=rlvr"],
  "eup": ["--config.method=svs", "--config.svs.mode=eup"],
}


def _train(workdir, arm, seed):
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
    *ARMS[arm],
    *FLAGS.extra,
  ]
  subprocess.run(cmd, cwd=REPO, check=True)
  return read_rows(workdir)


def _table(rows, seeds):
  """Markdown: held-out pass@1 / pass@8 per eval step, mean +- standard error over seeds."""
  first = rows[FLAGS.arms[0]][seeds[0]]
  steps = [r["step"] for r in first if "heldout_pass@1" in r]
  lines = [
    "| arm | " + " | ".join(f"step {s}" for s in steps) + " |",
    "|---|" + "---|" * len(steps),
  ]
  for arm in FLAGS.arms:
    cells = []
    for step in steps:
      parts = []
      for key in ("heldout_pass@1", "heldout_pass@8"):
        vals = [
          next((r[key] for r in rows[arm][s] if r["step"] == step and key in r), None)
          for s in seeds
        ]
        m, se = mean_se(vals)
        parts.append("-" if m is None else f"{100 * m:.1f}±{100 * se:.1f}")
      cells.append(" / ".join(parts))
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv):
  del argv
  root = os.path.abspath(FLAGS.workdir)
  unknown = sorted(set(FLAGS.arms) - set(ARMS))
  if unknown:
    raise app.UsageError(f"--arms: unknown {unknown}; expected some of {sorted(ARMS)}")
  seeds = [int(s) for s in FLAGS.seeds]
  rows = {arm: {} for arm in FLAGS.arms}
  for seed in seeds:
    first = os.path.join(root, f"seed{seed}", FLAGS.arms[0])
    for arm in FLAGS.arms:
      workdir = os.path.join(root, f"seed{seed}", arm)
      if arm != FLAGS.arms[0]:
        share_sft(first, workdir)
      rows[arm][seed] = _train(workdir, arm, seed)

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = ["entropy", "heldout_pass@1", "heldout_pass@8", "svs_accepted", "svs_accepted_consistent"]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2))
  for ax, key in zip(axes, keys):
    for name in FLAGS.arms:
      per_seed = [[(r["step"], r[key]) for r in rows[name][s] if key in r] for s in seeds]
      if not per_seed[0]:
        continue
      steps = [st for st, _ in per_seed[0]]
      values = [sum(ps[i][1] for ps in per_seed) / len(seeds) for i in range(len(steps))]
      if key.startswith("heldout"):
        ax.plot(steps, values, marker=".", label=f"{name} (mean of {len(seeds)} seeds)")
      else:  # per-step and noisy: faint raw values, a 10-step running mean on top
        (line,) = ax.plot(steps, values, alpha=0.25)
        window = [
          sum(values[max(0, i - 9) : i + 1]) / len(values[max(0, i - 9) : i + 1])
          for i in range(len(values))
        ]
        ax.plot(steps, window, color=line.get_color(), label=name)
    ax.set_title(key if key.startswith("heldout") else f"{key} (10-step mean)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(root, "study.png"), dpi=110)
  summary = {"seeds": seeds, "arms": {}}
  for name in FLAGS.arms:
    per = {}
    for seed, rs in rows[name].items():
      evals = [r for r in rs if "heldout_pass@1" in r]
      train = rs[1:]
      per[seed] = {
        "sft_pass@1": evals[0]["heldout_pass@1"],
        "final_pass@1": evals[-1]["heldout_pass@1"],
        "final_pass@8": evals[-1]["heldout_pass@8"],
        "mean_entropy_last10": sum(r["entropy"] for r in train[-10:]) / max(1, len(train[-10:])),
        "accepted_per_step": sum(r.get("svs_accepted", 0) for r in train) / len(train),
        "consistent_accepted_per_step": (
          sum(r.get("svs_accepted_consistent", 0) for r in train) / len(train)
        ),
      }
    summary["arms"][name] = {
      "per_seed": per,
      **{f"{k}_mean_se": mean_se([v[k] for v in per.values()]) for k in next(iter(per.values()))},
    }
  base = FLAGS.arms[0]
  for name in FLAGS.arms[1:]:  # paired by seed: same data split and SFT
    diffs = [rows_final(rows, name, s) - rows_final(rows, base, s) for s in seeds]
    summary["arms"][name][f"final_pass@1_minus_{base}_mean_se"] = mean_se(diffs)
  summary["table"] = _table(rows, seeds)
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])
  print(
    json.dumps(
      {a: {k: v for k, v in d.items() if k != "per_seed"} for a, d in summary["arms"].items()},
      indent=2,
    )
  )
  print(f"plot: {os.path.join(root, 'study.png')}")


def rows_final(rows, arm, seed):
  return [r for r in rows[arm][seed] if "heldout_pass@1" in r][-1]["heldout_pass@1"]


if __name__ == "__main__":
  app.run(main)
