r"""RL training (SFT warm start, evaluation, GRPO) from an ml_collections config.

  python -m launch.train --config=configs/tiny.py
  python -m launch.train --config=configs/tiny.py --config.rl.steps=5 --workdir=/tmp/run

Rerunning the same command resumes from the work dir's last checkpoint.
"""

import json

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/tiny.py", "Experiment config.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Work dir (default: the config's workdir).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines drown the progress bars
  from rlvr import runner
  cfg = FLAGS.config
  if FLAGS.workdir:
    with cfg.unlocked():
      cfg.workdir = FLAGS.workdir
  summary = runner.run(cfg)
  print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, indent=2))
  for k, v in summary.items():   # per-step lists on one line each
    if isinstance(v, list):
      print(f"{k}: {json.dumps(v)}")
  print(f"summary: {cfg.workdir}/summary.json")


if __name__ == "__main__":
  app.run(main)
