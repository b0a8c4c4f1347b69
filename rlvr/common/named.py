"""Code a config names by "package.module:attribute": estimators, losses, methods, rewards.

`load` is the one resolver: a built-in name picks from the caller's table, anything with a
colon is imported. Every failure is a ValueError of one line that names the config field.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping


def load(field: str, name: str, known: Mapping[str, Any], what: str, form: str = "function") -> Any:
  """known[name], or the attribute "package.module:attribute" names; else a one-line error.

  field: the config field the name comes from (the error's first word); what: what the
  field holds ("an estimator"); form: what the attribute is ("function", "factory").
  A module that cannot be imported for any reason (missing, raises while importing, a
  syntax error) is an error naming the field and the module.
  """
  if name in known:
    return known[name]
  if ":" not in name:
    raise ValueError(
      f"{field}: unknown {name!r}; known: {sorted(known)}, or "
      f"'package.module:{form}' for {what} defined elsewhere"
    )
  module, attr = name.split(":", 1)
  try:
    obj = getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"{field}: cannot load {name!r}: {e}") from e
  except Exception as e:  # noqa: BLE001 - the module itself failed: say how, in one line
    raise ValueError(
      f"{field}: cannot load {name!r}: importing {module!r} raised {type(e).__name__}: {e}"
    ) from e
  if not callable(obj):
    raise ValueError(f"{field}: {name!r} is not a {form} (type {type(obj).__name__})")
  return obj
