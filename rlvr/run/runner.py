"""`run(config)`: what `launch/train.py` calls. The config is checked whole before anything
is built, JAX's processes join, and the work dir's lock is held while the run's `Trainer`
(rlvr/run/trainer.py) sets up and fits; rerunning the same command resumes."""

from __future__ import annotations

import os
import time

from rlvr.parallel import distributed
from rlvr.run import experiment
from rlvr.run import workdir as workdir_lib
from rlvr.run.trainer import Trainer


def run(cfg) -> dict:
  """Runs (or resumes) the experiment described by an ml_collections config, holding the
  work dir's lock (`fileio.workdir_lock`): a second run on the same work dir stops at
  once with one line naming the holder's pid and host. Returns summary.json's contents."""
  t_start = time.time()
  s = experiment.check(cfg)  # every setting, before anything is built or trained
  distributed.initialize(s.coordinator or None)
  workdir = os.path.abspath(s.workdir)
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock(workdir):
    return Trainer.build(s, t_start).fit()
