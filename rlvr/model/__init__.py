"""Decoder model: config, Flax forward pass, HF checkpoint I/O, tiny-model factory."""

from rlvr.model.config import ConfigError, ModelConfig, RopeScaling
from rlvr.model.decoder import (
  KVCache,
  LayerGroup,
  Routing,
  count_params,
  forward,
  init,
  layer_groups,
  logical_axes,
  param_shapes,
  param_shardings,
)
from rlvr.model.hf_io import CheckpointError, load_hf, save_hf
from rlvr.model.tiny import TINY, make_tiny, train_tokenizer

__all__ = [
  "CheckpointError",
  "ConfigError",
  "KVCache",
  "LayerGroup",
  "ModelConfig",
  "RopeScaling",
  "Routing",
  "count_params",
  "forward",
  "init",
  "layer_groups",
  "load_hf",
  "logical_axes",
  "TINY",
  "make_tiny",
  "param_shapes",
  "param_shardings",
  "save_hf",
  "train_tokenizer",
]
