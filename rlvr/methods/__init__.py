"""RL methods behind one protocol (`base.Method`); `make(cfg, train)` picks one by name,
`check(cfg)` freezes and checks its section before anything is built.

cfg.method is a known name, or "package.module:factory" for a method that
lives outside the library (the factory takes (cfg, train prompts) and returns
a `base.Method`), so a new method needs no edit here.
"""

from __future__ import annotations

from typing import Sequence

from rlvr.common import named
from rlvr.methods import composition, plain, qbq, svs
from rlvr.methods.base import Method, Prompt

KNOWN = {"rlvr": plain.make, "svs": svs.make, "composition": composition.make, "qbq": qbq.make}
# Each known method's own section, frozen and checked against the rest of the run config.
CHECKS = {"svs": svs.check, "composition": composition.check, "qbq": qbq.check}


def check(cfg):
  """The method's section (`svs`, `composition`, `qbq`) as its frozen dataclass, checked
  with the settings it spans (QbQ's rounds against rl.steps), at launch; None for a method
  without one. A "package.module:factory" method checks its own settings when it is made."""
  named.load("method", cfg.method, KNOWN, "a method", form="factory")
  return CHECKS[cfg.method](cfg) if cfg.method in CHECKS else None


def make(cfg, train: Sequence[Prompt]) -> Method:
  """The method cfg.method names, built from the run config and the training prompts."""
  factory = named.load("method", cfg.method, KNOWN, "a method", form="factory")
  return factory(cfg, train)
