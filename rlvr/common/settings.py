"""Config sections <-> the library's frozen dataclasses: one place for every default.

`section(cls)` makes a ConfigDict of every field of a dataclass with its
default (Optional fields become typed placeholders, so `--config.x.y=...`
works on them too); base configs build their sections with it and experiment
configs override single fields. `frozen(cls, section)` turns a section back
into the validated dataclass at the launch boundary, naming unknown fields (one of verl's or
TRL's names is told rlvr's: `vocabulary`).
A field whose type is itself a dataclass (`LearnerConfig.lora`) becomes a
nested section, and is frozen back the same way. A field whose metadata names a
`DERIVED` source (`RLConfig.seed` is the run's `seed`; `LearnerConfig.total_steps` is
".steps", the `steps` beside the section that holds it: sft.steps for sft.learner, rl.steps
for rl.learner) is not in the section: the launch fills it, and a section that sets it is
told where the value lives.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

import ml_collections

from rlvr.common import vocabulary

DERIVED = "derived_from"  # field metadata: the config path the launch takes the value from


def derived(default, source: str):
  """A dataclass field filled at launch from the config path `source` (".name": `name`
  beside the section that holds the field), not set in its own section (one value for the
  whole run)."""
  return dataclasses.field(default=default, metadata={DERIVED: source})


def source_path(section: str, source: str) -> str:
  """The config path a derived field of the section at `section` ("sft.learner") takes its
  value from: `source` itself, or for ".name" the `name` beside that section ("sft.name")."""
  if not source.startswith("."):
    return source
  return ".".join([*section.split(".")[:-1], source[1:]]).lstrip(".")


def _optional_type(hint) -> type | None:
  """T for `T | None` / Optional[T], else None."""
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(hint):
      return typing.get_origin(args[0]) or args[0]
  return None


def section(cls, **overrides) -> ml_collections.ConfigDict:
  """ConfigDict of every field of dataclass `cls` at its default (plus overrides)."""
  hints = typing.get_type_hints(cls)
  c = ml_collections.ConfigDict()
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(unknown_fields(cls.__name__, "", overrides, unknown, names))
  for f in dataclasses.fields(cls):
    if DERIVED in f.metadata:
      continue
    value = overrides.get(f.name, f.default)
    if value is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
      value = f.default_factory()
    if value is dataclasses.MISSING:
      raise ValueError(f"{cls.__name__}.{f.name}: has no default; pass it to section()")
    inner = _optional_type(hints[f.name])
    if dataclasses.is_dataclass(hints[f.name]):
      if dataclasses.is_dataclass(value):
        value = {g.name: getattr(value, g.name) for g in dataclasses.fields(value)}
      value = section(hints[f.name], **value)
    elif value is None and inner is not None:
      value = ml_collections.config_dict.placeholder(inner)
    elif typing.get_args(hints[f.name])[:1] == (str,) and isinstance(value, tuple):
      value = list(value)  # paths, URLs: comma-separated on the command line (launch.train)
    c[f.name] = value
  return c


def frozen(cls, d: Mapping[str, Any] | ml_collections.ConfigDict, prefix: str = "") -> Any:
  """Config section -> frozen dataclass `cls`; unknown fields are named; lists become tuples.

  With `prefix` (the section's place in the config, e.g. "rl.loop."), a field's error names
  it in full: "rl.loop.group_size: ..." instead of "group_size: ..." (or of
  "RLConfig.group_size: ...").
  """
  if dataclasses.is_dataclass(d):
    return d
  d = d.to_dict() if isinstance(d, ml_collections.ConfigDict) else dict(d)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(unknown_fields(prefix.rstrip(".") or cls.__name__, prefix, d, unknown, names))
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    if f.name in d and DERIVED in f.metadata:
      raise ValueError(
        f"{prefix or cls.__name__ + '.'}{f.name}: set "
        f"{source_path(prefix.rstrip('.'), f.metadata[DERIVED])} instead (one value for the "
        "whole run)"
      )
    if f.name in d and isinstance(d[f.name], list):
      d[f.name] = tuple(d[f.name])
    elif f.name in d and dataclasses.is_dataclass(hints[f.name]) and isinstance(d[f.name], Mapping):
      d[f.name] = frozen(hints[f.name], d[f.name], prefix and f"{prefix}{f.name}.")
  try:
    return cls(**d)
  except ValueError as e:
    if not prefix or str(e).startswith(prefix):
      raise
    # "RewardConfig.extraction: ..." names the field by its class: the config path instead
    text = str(e).removeprefix(f"{cls.__name__}.")
    raise ValueError(f"{prefix}{text}") from None


def _leaf_paths(key: str, value) -> list[str]:
  """`key`, or for a nested section set under it the dotted paths of its leaves
  (optim = {"lr": ...} -> optim.lr)."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  if not isinstance(value, Mapping) or not value:
    return [key]
  return [f"{key}.{path}" for k, v in value.items() for path in _leaf_paths(str(k), v)]


def unknown_fields(where: str, prefix: str, given: Mapping[str, Any], unknown, known) -> str:
  """The error for fields a section does not have: the one line of `vocabulary` for the first
  that is verl's or TRL's name for a setting (rl.loop.num_generations -> rl.loop.group_size),
  else every unknown field and the known ones. `where` names the section in the second form,
  `prefix` is its place in the config ("rl.loop."; "" when not known)."""
  for key in unknown:
    for path in _leaf_paths(key, given[key]):
      line = vocabulary.unknown_field(
        prefix.rstrip("."), path, f"{prefix}{path}" if prefix else f"{where}.{path}"
      )
      if line:
        return line
  return f"{where}: unknown config fields {unknown}; known: {sorted(known)}"
