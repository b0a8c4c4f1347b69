"""RL methods behind one protocol (`base.Method`). At launch `check(cfg)` freezes and checks
the method's section into a `MethodSettings`; `make(settings, train)` builds the method it
names.

`method` is a known name, or "package.module:factory" for a method that lives outside the
library (the factory takes (`MethodSettings`, train prompts) and returns a `base.Method`),
so a new method needs no edit here.
"""

from __future__ import annotations

from typing import Sequence

from rlvr.common import named
from rlvr.methods import composition, plain, qbq, svs
from rlvr.methods.base import Method, MethodSettings, Prompt

KNOWN = {"rlvr": plain.make, "svs": svs.make, "composition": composition.make, "qbq": qbq.make}
# Each known method's own section, frozen and checked against the rest of the run config.
CHECKS = {"svs": svs.check, "composition": composition.check, "qbq": qbq.check}


def check(cfg) -> MethodSettings:
  """What the method `cfg.method` reads, typed: its section (`svs`, `composition`, `qbq`)
  frozen and checked with the settings it spans (QbQ's rounds against rl.steps), at launch,
  before anything is built. A "package.module:factory" method has no section here."""
  named.load("method", cfg.method, KNOWN, "a method", form="factory")
  return MethodSettings(
    name=cfg.method,
    section=CHECKS[cfg.method](cfg) if cfg.method in CHECKS else None,
    seed=cfg.seed,
    workdir=cfg.workdir,
    api_key=cfg.sampler.api_key,
  )


def make(settings: MethodSettings, train: Sequence[Prompt]) -> Method:
  """The method `settings.name` names, built from its settings and the training prompts."""
  factory = named.load("method", settings.name, KNOWN, "a method", form="factory")
  return factory(settings, train)
