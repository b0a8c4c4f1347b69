"""Every module of rlvr/ reads in one sitting: at most 400 lines. The sandbox's judge,
rlvr/sandbox/driver.py, is exempt: it runs inside the sandbox as one script started from its
own source (`python -I -B -c`), standard library only, so it cannot be split into modules it
imports (its docstring says how it is started)."""

from __future__ import annotations

import glob
import os

from paths import REPO

LIMIT = 400
ONE_SCRIPT = {"rlvr/sandbox/driver.py"}


def test_no_module_of_rlvr_is_over_400_lines():
  sizes = {}
  for path in glob.glob(os.path.join(REPO, "rlvr", "**", "*.py"), recursive=True):
    with open(path) as f:
      sizes[os.path.relpath(path, REPO)] = sum(1 for _ in f)
  assert len(sizes) > 100 and "rlvr/run/trainer.py" in sizes  # the tree was found
  over = {p: n for p, n in sizes.items() if n > LIMIT and p not in ONE_SCRIPT}
  assert not over, f"over {LIMIT} lines: {over}"
  assert all(p in sizes for p in ONE_SCRIPT)  # an exemption for a file that exists
