"""How a run ends, said: the health monitor it reports through, the one-line errors of a
step that was not finite or of a run without signal, and summary.json with its plots."""

from __future__ import annotations

import os

from rlvr import rollout
from rlvr.parallel import distributed
from rlvr.report import health, plots
from rlvr.report import metrics as metrics_lib
from rlvr.rewards.verifiers import VERIFIERS
from rlvr.run import evaluation, experiment
from rlvr.run import workdir as workdir_lib
from rlvr.run.workdir import Run


def health_monitor(s: experiment.Settings) -> health.Monitor:
  """The run's health warnings (the `health` section, docs/health.md); reward against
  correctness where the reward is more than the verifier's verdict (shaping, a custom one)."""
  custom = s.shaping.active or s.reward.domain not in VERIFIERS
  return health.Monitor(s.health, custom_reward=custom, format_bonus=s.shaping.format_bonus)


def nonfinite_message(error: Exception, step: int, steps: int, mngr) -> str:
  """The error of an RL step (0-based `step`) whose update had a loss or gradient that was
  not finite (`learner.NonFiniteError`): the step, the learner's line, the newest
  checkpoint (saved before it: no checkpoint holds this step's state)."""
  last = mngr.latest_step()
  where = str(mngr.directory)
  kept = (
    f"the last good checkpoint is step {last} in {where}"
    if last is not None
    else f"no checkpoint was saved before it (in {where})"
  )
  return f"RL step {step + 1} of {steps}: {error}; nothing of this step was saved, {kept}"


def no_update_message(solved, workdir: str) -> str:
  """The error of an invocation whose every RL step skipped its update; solved: the
  (solve_all, solve_none) of each of its steps."""
  solve_all, solve_none = (sum(x) / len(solved) for x in zip(*solved))
  return (
    f"every one of the {len(solved)} RL steps skipped its update: no group had a learning "
    f"signal (reward variance; solve_all {solve_all:.0%}, solve_none {solve_none:.0%}); "
    f"{rollout.no_signal_fix(solve_all, solve_none)}; see {workdir}/metrics.jsonl"
  )


def write_summary(run: Run, method, seconds: float, phases_s: dict | None = None) -> dict:
  """Plots and summary.json from the metrics of all invocations; phases_s: this
  invocation's seconds per phase (`Trainer.timed`)."""
  rows = metrics_lib.read_jsonl(os.path.join(run.workdir, "metrics.jsonl"))
  name = os.path.basename(run.workdir)
  if rows and distributed.is_writer():
    plots.plot_metrics(
      rows,
      plots.TRAINING_PANELS,
      os.path.join(run.workdir, "training.png"),
      title=name,
      before=run.progress.get("eval_before"),
      after=run.progress.get("eval_after"),
    )
    if method.plot_keys:
      mark = method.mark_key
      plots.plot_metrics(
        rows,
        method.plot_keys,
        os.path.join(run.workdir, f"{method.name}.png"),
        title=f"{name}: {method.name}",
        marks=[r["step"] + 1 for r in rows if mark and r.get(mark)],
      )
  reports = {
    label: os.path.join(run.workdir, f"eval_{tag}", "eval.json")
    for label, tag in (("before RL", "before_rl"), ("after RL", "after_rl"))
  }
  if distributed.is_writer() and all(os.path.exists(p) for p in reports.values()):
    evaluation.plot_comparison(
      {label: workdir_lib.json_file(p) for label, p in reports.items()},
      os.path.join(run.workdir, "pass_at_k.png"),
      name,
    )
  summary = {
    "steps": run.settings.rl_steps,
    "eval_before_rl": run.progress["eval_before"],
    "eval_after_rl": run.progress["eval_after"],
    "time_s_this_invocation": round(seconds, 1),
    "phases_s": phases_s or {},
    "method": method.name,
    "preflight": run.progress.get("preflight"),
    "health": [w.as_dict() for w in health.replay(health_monitor(run.settings), rows)],
    "model_dir": run.model_dir,
    "workdir": run.workdir,
    **method.summary(rows),
  }
  return workdir_lib.json_file(os.path.join(run.workdir, "summary.json"), summary)
