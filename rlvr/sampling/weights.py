"""The policy's weights as a sampler takes them: the untied checkpoint `save_hf` would
write, in HF names and the sync dtype, one tensor at a time and in buckets; the data plane
(`Transport`) every weight-transfer backend implements, and the error of one failed try."""

from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from rlvr.model import hf_io
from rlvr.model.config import ModelConfig


class TransferError(RuntimeError):
  """One try of a push failed (the caller retries or names the server)."""


class Transport(Protocol):
  """The data plane of one weight-transfer backend, for one server."""

  backend: str  # the engine name the server was started with
  atomic: bool  # the server applies an update only once all of it has arrived

  def open(self, world_size: int) -> dict:
    """Opens this side's endpoint; the `init_info` of `/init_weight_transfer_engine`."""

  def connect(self) -> None:
    """The rendezvous, run while `/init_weight_transfer_engine` is in flight."""

  def tensors(self, config: ModelConfig, params: Any, dtype: Any) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) of the untied checkpoint, cast to `dtype`, one at a time."""

  def update_info(self, version: int, bucket: int, tensors: list, last: bool) -> dict:
    """The `update_info` of `/update_weights` for one bucket."""

  def send(self, version: int, bucket: int, tensors: list) -> None:
    """Streams one bucket; runs while its `/update_weights` is in flight."""

  def close(self) -> None:
    """Drops the endpoint (a server blocked on it fails at once)."""


@functools.lru_cache(maxsize=None)
def _to_hf_fn(out_sharding, layout: str, dtype, depth: int):
  def to_hf(x, index):
    return hf_io._to_hf(x[tuple(index[:depth])], layout).astype(dtype)

  return jax.jit(to_hf, out_shardings=out_sharding)


def _replicated(x: jax.Array):
  s = x.sharding
  if isinstance(s, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
  return s


def hf_arrays(config: ModelConfig, params: Any, dtype: Any) -> Iterator[tuple[str, jax.Array]]:
  """(HF name, array on this host's first device) of the untied checkpoint `save_hf`
  writes (`hf_io.hf_tensors`' names, order and values), one tensor at a time. Each is
  sliced out of its stack (layer, expert), gathered from its mesh shards (a replicated
  output sharding: a collective, so every process iterates alike), laid out and cast by
  one jitted call, on the device (the NCCL path hands it to torch from there)."""

  def fetch(x, layout, *index):
    x = jnp.asarray(x)
    cast = x.dtype if dtype is None else jnp.dtype(dtype)  # None: as the params are
    fn = _to_hf_fn(_replicated(x), layout, cast, len(index))
    return fn(x, jnp.asarray(index + (0,), jnp.int32)).addressable_shards[0].data

  if config.tie_word_embeddings:  # the untied copy: the LM head is the embedding
    yield "lm_head.weight", fetch(params["embedding"], "same")
  for entry in hf_io.active_rules(config):
    rule, value = entry.rule, hf_io._get(params, entry.path)
    if value is None or tuple(value.shape) != tuple(entry.leaf.shape):
      got = None if value is None else tuple(value.shape)
      raise hf_io.CheckpointError(
        f"params: {'/'.join(entry.path)} is {got}, config needs {tuple(entry.leaf.shape)}"
      )
    if not rule.per_layer:
      yield rule.hf, fetch(value, rule.layout)
      continue
    for i in range(value.shape[0]):
      if rule.per_expert:
        for e in range(value.shape[1]):
          yield entry.keys(i, e), fetch(value, rule.layout, i, e)
      else:
        yield entry.keys(i), fetch(value, rule.layout, i)


def host_tensors(config: ModelConfig, params: Any, dtype: Any) -> Iterator[tuple[str, np.ndarray]]:
  """`hf_arrays` as host numpy arrays (contiguous, in HF layout)."""
  for name, x in hf_arrays(config, params, dtype):
    yield name, np.ascontiguousarray(np.asarray(x))


def torch_dtype_name(dtype: Any) -> str:
  """torch's name of a numpy / JAX / torch dtype ("bfloat16", "float32", ...)."""
  return str(dtype).removeprefix("torch.")


def buckets(items: Iterable[tuple[str, Any]], max_bytes: int) -> Iterator[list[tuple[str, Any]]]:
  """Consecutive groups of (name, tensor) of at most `max_bytes` (a bigger tensor alone)."""
  group, size = [], 0
  for name, t in items:
    nbytes = int(t.nbytes)
    if group and size + nbytes > max_bytes:
      yield group
      group, size = [], 0
    group.append((name, t))
    size += nbytes
  if group:
    yield group


# -------------------------------------------------------------------- rlvr_tcp
