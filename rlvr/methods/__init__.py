"""RL methods behind one protocol (`base.Method`); `make(cfg, train)` picks one by name.

cfg.method is a known name, or "package.module:factory" for a method that
lives outside the library (the factory takes (cfg, train prompts) and returns
a `base.Method`), so a new method needs no edit here.
"""

from __future__ import annotations

import importlib
from typing import Sequence

from rlvr.methods import composition, plain, qbq, svs
from rlvr.methods.base import Method, Prompt

KNOWN = {"rlvr": plain.make, "svs": svs.make, "composition": composition.make, "qbq": qbq.make}


def make(cfg, train: Sequence[Prompt]) -> Method:
  """The method cfg.method names, built from the run config and the training prompts."""
  name = cfg.method
  if name in KNOWN:
    return KNOWN[name](cfg, train)
  if ":" not in name:
    raise ValueError(
      f"method: unknown {name!r}; known: {sorted(KNOWN)}, or "
      "'package.module:factory' for a method defined elsewhere"
    )
  module, attr = name.split(":", 1)
  try:
    factory = getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"method: cannot load {name!r}: {e}") from e
  return factory(cfg, train)
