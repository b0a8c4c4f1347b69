"""RL methods behind one protocol (`base.Method`); `make(cfg, train)` picks one by name.

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


def make(cfg, train: Sequence[Prompt]) -> Method:
  """The method cfg.method names, built from the run config and the training prompts."""
  factory = named.load("method", cfg.method, KNOWN, "a method", form="factory")
  return factory(cfg, train)
