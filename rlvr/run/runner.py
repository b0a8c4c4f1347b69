"""`trainer(config)`: what `launch/train.py` fits. The config is checked whole before anything
is built, JAX's processes join, and the work dir's lock is held while the run's `Trainer`
(rlvr/run/trainer.py) sets up and fits; rerunning the same command resumes.

    with runner.trainer(cfg) as t:
      summary = t.fit()

`run(config)` is the same in one call."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from rlvr.parallel import distributed
from rlvr.run import experiment
from rlvr.run import workdir as workdir_lib
from rlvr.run.trainer import Trainer


@contextlib.contextmanager
def trainer(cfg) -> Iterator[Trainer]:
  """The experiment an ml_collections config describes, set up (`Trainer.build`), while
  the work dir's lock is held (`fileio.workdir_lock`): a second run on the same work dir
  stops at once with one line naming the holder's pid and host."""
  t_start = time.time()
  s = experiment.check(cfg)  # every setting, before anything is built or trained
  distributed.initialize(s.coordinator or None)
  workdir = os.path.abspath(s.workdir)
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock(workdir):
    yield Trainer.build(s, t_start)


def run(cfg) -> dict:
  """Runs (or resumes) the experiment; returns summary.json's contents."""
  with trainer(cfg) as t:
    return t.fit()
