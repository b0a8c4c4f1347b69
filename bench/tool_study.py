r"""Study: the python tool against no tool at embedded scale, paired by seed.

  python bench/tool_study.py [--steps=60] [--seeds=0,1]

Both arms are configs/tiny_tool.py: the same SFT warm start per seed (worked solutions that
call the tool; trained once, copied to the other arm), then GRPO with `env.name=python_tool`
("tool") or `env.name=single_turn` ("no_tool": the same policy, which must make up the
block's output). Each arm evaluates held-out pass@1 in its own environment before and after
RL. Prints and writes to study.json, per arm, held-out pass@1 before and after RL (mean +-
standard error over seeds), the tool calls per episode over the first and last 10 steps,
the tool's error rate, and the paired difference of final pass@1 (tool minus no tool). A run
that stops (no group with a learning signal left) is reported with the step and the reason,
its policy's final pass@1 taken as its pass@1 before RL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_utils import define_run_flags, mean_se, train_command  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
define_run_flags(steps=60, workdir="workdir/tool_study")

ARMS = {"tool": "python_tool", "no_tool": "single_turn"}


def _train(workdir: str, arm: str, seed: int) -> dict:
  env = f"--config.env.name={ARMS[arm]}"
  cmd = train_command("configs/tiny_tool.py", workdir, FLAGS.steps, seed, env, *FLAGS.extra)
  out = subprocess.run(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  if out.returncode != 0:  # e.g. no group with a learning signal: a result, reported as such
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("launch.train:")]
    with open(os.path.join(workdir, "progress.json")) as f:
      before = json.load(f)["eval_before"]["heldout"]["pass@1"]
    return {
      "before": before,
      "after": None,
      "stopped": f"after {len(rows)} steps: {lines[-1] if lines else out.stderr[-300:]}",
      "calls_first10": 0.0,
      "calls_last10": 0.0,
      "tool_errors": 0.0,
    }
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  calls = [r.get("tool_calls_mean", 0.0) for r in rows]
  errors = [v for r in rows for k, v in r.items() if k.startswith("tool_error_frac_")]
  return {
    "before": summary["eval_before_rl"]["heldout"]["pass@1"],
    "after": summary["eval_after_rl"]["heldout"]["pass@1"],
    "calls_first10": sum(calls[:10]) / max(len(calls[:10]), 1),
    "calls_last10": sum(calls[-10:]) / max(len(calls[-10:]), 1),
    "tool_errors": sum(errors) / max(len(rows), 1),
  }


def _copy_sft(src: str, dst: str) -> None:
  """The seed's SFT warm start, copied (its evaluation is not: each arm evaluates in its own
  environment)."""
  if not os.path.exists(os.path.join(dst, "sft", "model")):
    os.makedirs(dst, exist_ok=True)
    shutil.copytree(os.path.join(src, "sft"), os.path.join(dst, "sft"))


def main(argv):
  del argv
  seeds = [int(s) for s in FLAGS.seeds]
  root = os.path.abspath(FLAGS.workdir)
  rows = {arm: {} for arm in ARMS}
  for seed in seeds:
    for arm in ARMS:
      workdir = os.path.join(root, f"seed{seed}", arm)
      if arm != "tool":
        _copy_sft(os.path.join(root, f"seed{seed}", "tool"), workdir)
      rows[arm][seed] = _train(workdir, arm, seed)
  cell = lambda m, se, sign="": "-" if m is None else f"{100 * m:{sign}.1f} ± {100 * se:.1f}"
  lines = [
    "| arm | pass@1 before RL | pass@1 after RL | tool calls / episode, first 10 steps -> last 10 |",
    "|---|---|---|---|",
  ]
  summary = {"seeds": seeds, "steps": FLAGS.steps, "arms": rows}
  for arm in ARMS:
    r = [rows[arm][s] for s in seeds]
    before, after = mean_se([x["before"] for x in r]), mean_se([x["after"] for x in r])
    first, last = mean_se([x["calls_first10"] for x in r]), mean_se([x["calls_last10"] for x in r])
    lines.append(f"| {arm} | {cell(*before)} | {cell(*after)} | {first[0]:.2f} -> {last[0]:.2f} |")
  final = lambda r: r["after"] if r["after"] is not None else r["before"]  # a stopped run's
  d = mean_se([final(rows["tool"][s]) - final(rows["no_tool"][s]) for s in seeds])  # policy
  summary["paired_final"] = d
  lines += ["", f"paired difference of final pass@1, tool - no tool: {cell(*d, sign='+')} points"]
  lines += [
    f"{arm} seed {s} stopped {rows[arm][s]['stopped']}"
    for arm in ARMS
    for s in seeds
    if rows[arm][s].get("stopped")
  ]
  summary["table"] = "\n".join(lines)
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(summary["table"])


if __name__ == "__main__":
  app.run(main)
