r"""Strict alternation vs one-step off-policy rollouts, side by side, with a vLLM CPU server.

  python bench/offpolicy.py [--steps=20] [--config=configs/tiny_rlvr.py]

One server (weight transfer on) serves the run's policy; the same `launch.train` command
runs twice from the same SFT warm start (`study_utils.share_sft`): rl.loop.max_staleness
0 (sample, then update, then push) and 1 (step t+1's buffer is sampled in a thread while
update t runs). Prints the median per-step seconds over steps 1.. (step 0 compiles): the
whole step, the update, sampling of the buffer used, the learner's and the sampler's idle
time, the overlap fraction; then the step-time ratio and final accuracy of each.
Learner and server share this machine's cores, so what overlap can save here is bounded
by the cores, not only by the shorter of sampling and update.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_utils import share_sft  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 20, "RL steps of each run.")
flags.DEFINE_string("config", "configs/tiny_rlvr.py", "The run's config (a tiny model).")
flags.DEFINE_string("workdir", None, "Where to write (default: a temp dir).")
flags.DEFINE_list("extra", [], "More --config.X=Y overrides for both runs.")

KEYS = (
  ("time_step", "step"),
  ("time_update", "update"),
  ("time_sample", "sampling"),
  ("time_learner_idle", "learner idle"),
  ("time_sampler_idle", "sampler idle"),
  ("overlap_frac", "overlap"),
)


def _run(work, model_dir, server, staleness):
  workdir = os.path.join(work, f"staleness{staleness}")
  if staleness:
    share_sft(os.path.join(work, "staleness0"), workdir)
  cmd = [
    sys.executable,
    "-m",
    "launch.train",
    f"--config={FLAGS.config}",
    f"--workdir={workdir}",
    f"--config.model.path={model_dir}",
    "--config.sampler.kind=vllm",
    f"--config.sampler.urls={server.url}",
    f"--config.sampler.model={server.options.served_model_name}",
    "--config.sampler.weight_sync=transfer",
    "--config.sampler.sync_dtype=float32",
    f"--config.rl.steps={FLAGS.steps}",
    f"--config.rl.loop.max_staleness={staleness}",
    "--config.data.arithmetic.n_heldout=64",
    "--config.eval.sampling.n=1",
    "--config.export_hf=False",
    *FLAGS.extra,
  ]
  subprocess.run(cmd, cwd=REPO, check=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  with open(os.path.join(workdir, "summary.json")) as f:
    after = json.load(f)["eval_after_rl"]
  return rows, after


def main(argv):
  del argv
  from configs import tiny_rlvr
  from rlvr import model
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  work = FLAGS.workdir or tempfile.mkdtemp(prefix="bench_offpolicy_")
  # The run's tiny shapes, untied (vLLM does not carry an in-place update to a tied head).
  tiny = dict(tiny_rlvr.get_config().model.tiny, tie_word_embeddings=False)
  model_dir = model.make_tiny(os.path.join(work, "model"), **tiny)
  server = start_server(
    model_dir,
    ServerOptions(max_model_len=512, weight_transfer="rlvr_tcp"),
    log_path=os.path.join(work, "vllm.log"),
  )
  try:
    runs = {s: _run(work, model_dir, server, s) for s in (0, 1)}
  finally:
    server.stop()
  med = {
    s: {k: statistics.median(r[k] for r in rows[1:] if k in r) for k, _ in KEYS}
    for s, (rows, _) in runs.items()
  }
  print(f"\nmedian over RL steps 1..{FLAGS.steps - 1} of {FLAGS.config} (seconds; overlap: share)")
  print("| max_staleness | " + " | ".join(label for _, label in KEYS) + " | held-out pass@1 |")
  print("|---|" + "---|" * (len(KEYS) + 1))
  for s, (_, after) in runs.items():
    cells = [f"{med[s][k]:.2f}" for k, _ in KEYS]
    acc = next(iter(after.values()))["pass@1"]
    print(f"| {s} | " + " | ".join(cells) + f" | {100 * acc:.1f}% |")
  ratio = med[0]["time_step"] / med[1]["time_step"]
  print(f"\nstep time, strict / one-step off-policy: {ratio:.2f}x")


if __name__ == "__main__":
  app.run(main)
