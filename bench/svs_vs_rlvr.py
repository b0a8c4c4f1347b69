r"""Study: the embedded default trained twice, plain RLVR and SvS, same seeds and steps.

  python bench/svs_vs_rlvr.py [--steps=60] [--eval_every=10] [--workdir=workdir/study]

Both runs start from the same SFT warm start (worked solutions + inverse pairs,
configs/tiny_svs.py) and differ only in `method`. Held-out pass@1 / pass@8 are
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
flags.DEFINE_string("workdir", "workdir/study", "Where both runs go.")


def _train(workdir, method, extra=()):
  cmd = [sys.executable, "-m", "launch.train", "--config=configs/tiny_svs.py",
         f"--workdir={workdir}", f"--config.method={method}", f"--config.rl.steps={FLAGS.steps}",
         f"--config.eval.every={FLAGS.eval_every}", "--config.eval.sampling.n=8", *extra]
  subprocess.run(cmd, cwd=REPO, check=True)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def main(argv):
  del argv
  root = os.path.abspath(FLAGS.workdir)
  rows = {}
  rows["svs"] = _train(os.path.join(root, "svs"), "svs")
  # Same SFT warm start for the baseline: copy it instead of training it again.
  base = os.path.join(root, "rlvr")
  if not os.path.exists(os.path.join(base, "sft", "model")):
    os.makedirs(base, exist_ok=True)
    shutil.copytree(os.path.join(root, "svs", "sft"), os.path.join(base, "sft"),
                    dirs_exist_ok=True)
    with open(os.path.join(root, "svs", "progress.json")) as f:
      before = json.load(f)["eval_before"]
    with open(os.path.join(base, "progress.json"), "w") as f:
      json.dump({"sft_done": True, "eval_before": before}, f)
  rows["rlvr"] = _train(base, "rlvr")

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  keys = ["entropy", "heldout_pass@1", "heldout_pass@8", "svs_accepted"]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2))
  for ax, key in zip(axes, keys):
    for name, rs in rows.items():
      pts = [(r["step"], r[key]) for r in rs if key in r]
      if pts:
        ax.plot(*zip(*pts), marker=".", label=name)
    ax.set_title(key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(root, "study.png"), dpi=110)
  summary = {}
  for name, rs in rows.items():
    evals = [r for r in rs if "heldout_pass@1" in r]
    summary[name] = {
        "final_pass@1": evals[-1]["heldout_pass@1"] if evals else None,
        "final_pass@8": evals[-1]["heldout_pass@8"] if evals else None,
        "mean_entropy_last10": sum(r["entropy"] for r in rs[-10:]) / max(1, len(rs[-10:])),
        "synthetic_accepted_per_step": (sum(r.get("svs_accepted", 0) for r in rs) / len(rs)),
    }
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(json.dumps(summary, indent=2))
  print(f"plot: {os.path.join(root, 'study.png')}")


if __name__ == "__main__":
  app.run(main)
