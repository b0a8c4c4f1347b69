"""Logical axis names -> mesh axes. The mesh is always an explicit argument."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec

# (logical axis, mesh axis or axes). FSDP shards the embed dimension of every
# weight; tensor parallelism splits heads, MLP and vocab; expert parallelism splits the
# experts of a mixture-of-experts layer, and outside those layers the "expert" axis is
# one more data-parallel axis.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
  ("batch", ("data", "fsdp", "expert")),
  ("length", None),
  ("embed", "fsdp"),
  ("vocab", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  ("layers", None),
  ("experts", "expert"),
  ("expert_mlp", "tensor"),
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


MESH_AXES = ("data", "fsdp", "expert", "tensor")


def make_mesh(axes: dict[str, int] | Sequence[tuple[str, int]], devices=None) -> jax.sharding.Mesh:
  """Mesh over ("data", "fsdp", "expert", "tensor"), each absent axis of size 1; one size
  may be -1 (the rest of the devices).

  Axes are Auto-typed so GSPMD propagates shardings from the jit boundaries.
  """
  sizes = dict(axes)
  unknown = set(sizes) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"mesh axes: unknown {sorted(unknown)}; expected {MESH_AXES}")
  devices = list(jax.devices() if devices is None else devices)
  sizes = {a: int(sizes.get(a, 1)) for a in MESH_AXES}
  rest = [a for a, s in sizes.items() if s == -1]
  if len(rest) > 1:
    raise ValueError(f"mesh axes: only one may be -1, got {rest}")
  known = 1
  for s in sizes.values():
    if s != -1:
      known *= s
  if rest:
    if len(devices) % known:
      raise ValueError(f"mesh axes {sizes}: {len(devices)} devices not divisible by {known}")
    sizes[rest[0]] = len(devices) // known
  total = 1
  for s in sizes.values():
    total *= s
  if total != len(devices):
    raise ValueError(f"mesh axes {sizes} need {total} devices, have {len(devices)}")
  shape = tuple(sizes[a] for a in MESH_AXES)
  return jax.make_mesh(
    shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES), devices=devices
  )


def tree_shardings(logical_tree, shapes_tree, mesh: jax.sharding.Mesh, rules=None):
  """NamedShardings for any pytree given its logical axes (PartitionSpec leaves) and shapes."""
  rules = DEFAULT_RULES if rules is None else rules
  specs = nn.logical_to_mesh(logical_tree, rules)
  return jax.tree.map(
    lambda s, x: NamedSharding(mesh, _fits(s, x.shape, mesh)),
    specs,
    shapes_tree,
    is_leaf=lambda s: isinstance(s, PartitionSpec),
  )


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int, rules=None) -> NamedSharding:
  """Leading (batch) dimension split over the data-parallel axes, the rest replicated
  (a scalar: replicated)."""
  if ndim == 0:
    return replicated(mesh)
  rules = DEFAULT_RULES if rules is None else rules
  spec = nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), rules)
  return NamedSharding(mesh, _present(spec, mesh))


def _present(spec: PartitionSpec, mesh: jax.sharding.Mesh) -> PartitionSpec:
  """`spec` less the mesh axes this mesh does not have."""
  out = []
  for axes in spec:
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    kept = tuple(n for n in names if n in mesh.shape)
    out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
  return PartitionSpec(*out)


def spec(logical: Sequence[str | None], shape: Sequence[int], mesh, rules=None) -> PartitionSpec:
  """The PartitionSpec `tree_shardings` gives one array of these logical axes and shape."""
  rules = DEFAULT_RULES if rules is None else rules
  return _fits(nn.logical_to_mesh_axes(tuple(logical), rules), shape, mesh)


def data_axes(mesh: jax.sharding.Mesh, size: int, rules=None) -> tuple[str, ...]:
  """The mesh axes that split a batch dimension of `size` rows (those of the "batch" rule
  that the mesh has and that divide it)."""
  rules = DEFAULT_RULES if rules is None else rules
  spec = _fits(nn.logical_to_mesh_axes(("batch",), rules), (size,), mesh)[0]
  return (spec,) if isinstance(spec, str) else tuple(spec or ())


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def put_global(x, sharding: NamedSharding) -> jax.Array:
  """A host array that every process holds in full -> a global array with `sharding`
  (each device takes its slice; works on one process and on many)."""
  import numpy as np

  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(x):
  """The whole array as numpy on this host; an array that spans several processes
  (multi-host) is gathered from all of them, so every process must call this."""
  import numpy as np

  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))
