"""Logical axis names -> mesh axes. The mesh is always an explicit argument."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec

from rlvr.model import decoder
from rlvr.model.config import ModelConfig

# (logical axis, mesh axis or axes). FSDP shards the embed dimension of every
# weight; tensor parallelism splits heads, MLP and vocab.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def _fits(spec: PartitionSpec, shape: Sequence[int], mesh: jax.sharding.Mesh) -> PartitionSpec:
  """Drops mesh axes the mesh lacks or that do not divide their dimension (2 KV heads, tensor=8)."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    kept = []
    size = 1
    for name in names:
      if name in mesh.shape and dim % (size * mesh.shape[name]) == 0:
        kept.append(name)
        size *= mesh.shape[name]
    out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*out)


def param_shardings(config: ModelConfig, mesh: jax.sharding.Mesh, rules=None):
  """NamedSharding pytree for the decoder parameters under `rules`."""
  rules = DEFAULT_RULES if rules is None else rules
  axes = decoder.logical_axes(config)
  shapes = decoder.param_shapes(config)
  specs = nn.logical_to_mesh(axes, rules)
  return jax.tree.map(lambda s, x: NamedSharding(mesh, _fits(s, x.shape, mesh)), specs, shapes,
                      is_leaf=lambda s: isinstance(s, PartitionSpec))
