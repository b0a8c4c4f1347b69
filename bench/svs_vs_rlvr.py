r"""Study: the embedded default trained twice, plain RLVR and SvS, same seeds and steps.

  python bench/svs_vs_rlvr.py [--steps=60] [--eval_every=10] [--arms=svs,rlvr,eup]

Both runs start from the same SFT warm start (worked solutions + inverse pairs,
configs/tiny.py) and differ only in `method`. Held-out pass@1 / pass@8 are
measured every --eval_every steps. Writes study.png (entropy, pass@1, pass@8,
synthetic problems accepted per step) and study.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 60, "GRPO steps of each run.")
flags.DEFINE_integer("eval_every", 10, "Held-out evaluation interval (steps).")
flags.DEFINE_string("workdir", "workdir/study", "Where the runs go.")
flags.DEFINE_list("arms", ["svs", "rlvr"], "Runs to compare: svs, rlvr, eup (SvS's ablation: "
                  "a second rollout on underperforming problems instead of synthesis).")
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for every arm.")

ARMS = {"svs": ["--config.method=svs"], "rlvr": ["--config.method=rlvr"],
        "eup": ["--config.method=svs", "--config.svs.mode=eup"]}


def _train(workdir, arm):
  cmd = [sys.executable, "-m", "launch.train", "--config=configs/tiny.py",
         f"--workdir={workdir}", f"--config.rl.steps={FLAGS.steps}",
         f"--config.eval.every={FLAGS.eval_every}", "--config.eval.sampling.n=8", *ARMS[arm],
         *FLAGS.extra]
  subprocess.run(cmd, cwd=REPO, check=True)
  with open(os.path.join(workdir, "progress.json")) as f:
    before = json.load(f)["eval_before"]["heldout"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  # The SFT warm start's evaluation, plotted at step 0.
  return [{"step": 0, **{f"heldout_{k}": v for k, v in before.items()}}] + [
      {**r, "step": r["step"] + 1} for r in rows]


def main(argv):
  del argv
  root = os.path.abspath(FLAGS.workdir)
  unknown = sorted(set(FLAGS.arms) - set(ARMS))
  if unknown:
    raise app.UsageError(f"--arms: unknown {unknown}; expected some of {sorted(ARMS)}")
  rows = {}
  first = os.path.join(root, FLAGS.arms[0])
  for arm in FLAGS.arms:
    workdir = os.path.join(root, arm)
    if arm != FLAGS.arms[0] and not os.path.exists(os.path.join(workdir, "sft", "model")):
      # Same SFT warm start and its evaluation: copied, not trained again.
      os.makedirs(workdir, exist_ok=True)
      shutil.copytree(os.path.join(first, "sft"), os.path.join(workdir, "sft"))
      with open(os.path.join(first, "progress.json")) as f:
        before = json.load(f)["eval_before"]
      with open(os.path.join(workdir, "progress.json"), "w") as f:
        json.dump({"eval_before": before}, f)
    rows[arm] = _train(workdir, arm)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  keys = ["entropy", "heldout_pass@1", "heldout_pass@8", "svs_accepted",
          "svs_accepted_consistent"]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2))
  for ax, key in zip(axes, keys):
    for name, rs in rows.items():
      pts = [(r["step"], r[key]) for r in rs if key in r]
      if not pts:
        continue
      steps, values = zip(*pts)
      if key.startswith("heldout"):
        ax.plot(steps, values, marker=".", label=name)
      else:   # per-step and noisy: faint raw values, a 10-step running mean on top
        line, = ax.plot(steps, values, alpha=0.25)
        window = [sum(values[max(0, i - 9):i + 1]) / len(values[max(0, i - 9):i + 1])
                  for i in range(len(values))]
        ax.plot(steps, window, color=line.get_color(), label=name)
    ax.set_title(key if key.startswith("heldout") else f"{key} (10-step mean)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(root, "study.png"), dpi=110)
  summary = {}
  for name, rs in rows.items():
    evals = [r for r in rs if "heldout_pass@1" in r]
    rs = rs[1:]   # training steps only
    summary[name] = {
        "sft_pass@1": evals[0]["heldout_pass@1"], "sft_pass@8": evals[0]["heldout_pass@8"],
        "final_pass@1": evals[-1]["heldout_pass@1"] if evals else None,
        "final_pass@8": evals[-1]["heldout_pass@8"] if evals else None,
        "mean_entropy_last10": sum(r["entropy"] for r in rs[-10:]) / max(1, len(rs[-10:])),
        "synthetic_accepted_per_step": (sum(r.get("svs_accepted", 0) for r in rs) / len(rs)),
        "consistent_accepted_per_step": (sum(r.get("svs_accepted_consistent", 0) for r in rs)
                                         / len(rs)),
    }
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(json.dumps(summary, indent=2))
  print(f"plot: {os.path.join(root, 'study.png')}")


if __name__ == "__main__":
  app.run(main)
