"""A plot panel a method declares (drawn by `rlvr.report.plots`): several series of one quantity."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Panel:
  """A plot key drawing several series of one quantity on one panel, with a legend."""

  title: str
  unit: str  # the y-axis label
  series: tuple[tuple[str, str], ...]  # (metric key, legend label)
