"""Decoder hyper-parameters, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

# HF architecture name -> our family name. Each family fixes the per-layer
# details that config.json does not spell out (qkv bias, q/k norm).
ARCHITECTURES = {
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
  "LlamaForCausalLM": "llama",
  "Qwen3MoeForCausalLM": "qwen3_moe",
}
_FAMILY_TO_ARCH = {v: k for k, v in ARCHITECTURES.items()}


class ConfigError(ValueError):
  """A config.json that this library cannot turn into a `ModelConfig`."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 frequency-dependent RoPE scaling (`rope_type: "llama3"`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class HFField:
  """Where one `ModelConfig` field is in an HF config.json.

  names: the spellings transformers versions write, the first present (and not null)
    one wins; a dotted name is a key of a nested dict ("rope_parameters.rope_theta").
  default: the value when none is present; `_REQUIRED` makes that an error naming the
    field, a callable computes it from the fields read above it.
  cast: turns the JSON value into the field's type.
  """

  names: tuple[str, ...]
  default: Any = _REQUIRED
  cast: Callable[[Any], Any] = lambda v: v


def _first_id(value):
  """A token id; a list of them (several eos ids) gives its first."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)


# ModelConfig field -> its config.json spellings, in one place. transformers 5 writes
# the RoPE base only inside `rope_parameters`, transformers 4 at the top level
# (`rope_theta`); a llama3-scaled `rope_scaling` dict may carry it too. head_dim is
# absent from Llama-2-era hub configs and from what transformers 5 writes for Qwen2
# and Qwen3-MoE: then hidden_size / num_attention_heads.
HF_FIELDS: dict[str, HFField] = {
  "vocab_size": HFField(("vocab_size",), cast=int),
  "hidden_size": HFField(("hidden_size",), cast=int),
  "intermediate_size": HFField(("intermediate_size",), cast=int),
  "num_layers": HFField(("num_hidden_layers",), cast=int),
  "num_heads": HFField(("num_attention_heads",), cast=int),
  "num_kv_heads": HFField(("num_key_value_heads",), lambda f: f["num_heads"], int),
  "head_dim": HFField(("head_dim",), lambda f: f["hidden_size"] // f["num_heads"], int),
  "rope_theta": HFField(
    ("rope_parameters.rope_theta", "rope_theta", "rope_scaling.rope_theta"), 10000.0, float
  ),
  "rms_norm_eps": HFField(("rms_norm_eps",), cast=float),
  "tie_word_embeddings": HFField(("tie_word_embeddings",), False, bool),
  "max_position_embeddings": HFField(("max_position_embeddings",), 32768, int),
  "bos_token_id": HFField(("bos_token_id",), None, _first_id),
  "eos_token_id": HFField(("eos_token_id",), None, _first_id),
}
# Read for family qwen3_moe only. transformers 5 names the expert count
# `num_local_experts` (Qwen3MoeConfig.attribute_map); hub checkpoints say `num_experts`.
HF_MOE_FIELDS: dict[str, HFField] = {
  "num_experts": HFField(("num_experts", "num_local_experts"), cast=int),
  "num_experts_per_tok": HFField(("num_experts_per_tok",), cast=int),
  "moe_intermediate_size": HFField(("moe_intermediate_size",), cast=int),
  "norm_topk_prob": HFField(("norm_topk_prob",), False, bool),
  "decoder_sparse_step": HFField(("decoder_sparse_step",), 1, int),
  "mlp_only_layers": HFField(("mlp_only_layers",), (), lambda v: tuple(int(i) for i in v)),
  "router_aux_loss_coef": HFField(("router_aux_loss_coef",), 0.001, float),
}
# The dicts that hold the RoPE type and its scaling parameters (transformers 5, then 4),
# and the two names of the type inside them.
ROPE_DICTS = ("rope_parameters", "rope_scaling")
ROPE_TYPE_KEYS = ("rope_type", "type")


def _lookup(hf: Mapping[str, Any], name: str) -> Any:
  """hf[name], a dotted name walking nested dicts; None when absent."""
  value: Any = hf
  for part in name.split("."):
    if not isinstance(value, Mapping) or value.get(part) is None:
      return None
    value = value[part]
  return value


def _read(hf, where: str, name: str, spec: HFField, fields: Mapping[str, Any] | None = None):
  """The field `name` of `hf` under the first spelling present, else its default."""
  for key in spec.names:
    value = _lookup(hf, key)
    if value is not None:
      try:
        return spec.cast(value)
      except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key}: not a valid {name} ({value!r})") from None
  if spec.default is _REQUIRED:
    spelled = " or ".join(repr(k) for k in spec.names)
    raise ConfigError(f"{where}: missing required field {spelled}")
  return spec.default(fields) if callable(spec.default) else spec.default


def _rope_scaling(hf, where: str) -> RopeScaling | None:
  rope = next((hf[k] for k in ROPE_DICTS if isinstance(hf.get(k), Mapping)), {})
  rope_type = next((rope[k] for k in ROPE_TYPE_KEYS if rope.get(k) is not None), "default")
  if rope_type == "default":
    return None
  if rope_type != "llama3":
    raise ConfigError(
      f"{where}: rope_scaling.rope_type: unsupported {rope_type!r}; supported: default, llama3"
    )
  try:
    return RopeScaling(
      factor=float(rope["factor"]),
      low_freq_factor=float(rope["low_freq_factor"]),
      high_freq_factor=float(rope["high_freq_factor"]),
      original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )
  except KeyError as e:
    raise ConfigError(f"{where}: rope_scaling: missing field {e.args[0]!r}") from None


def _check_unsupported(hf, where: str, family: str, num_layers: int) -> None:
  """Settings of these families that the decoder does not implement are errors."""
  if family == "qwen2" and hf.get("attention_bias") is False:
    raise ConfigError(f"{where}: attention_bias: Qwen2 without qkv bias is not supported")
  if family in ("qwen3", "qwen3_moe") and hf.get("attention_bias"):
    raise ConfigError(f"{where}: attention_bias: {family} with qkv bias is not supported")
  if family == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
    raise ConfigError(f"{where}: attention_bias/mlp_bias: Llama with biases is not supported")
  # transformers 5 lists each layer's attention in `layer_types`; transformers 4 slides
  # the window over layers max_window_layers.. when use_sliding_window is set.
  layer_types = hf.get("layer_types")
  if layer_types:
    sliding = [i for i, t in enumerate(layer_types) if t != "full_attention"]
  elif hf.get("use_sliding_window"):
    sliding = list(range(int(hf.get("max_window_layers") or 0), num_layers))
  else:
    sliding = []
  if sliding:
    raise ConfigError(
      f"{where}: layer_types / use_sliding_window: sliding-window attention (layers "
      f"{sliding}) is not supported; every layer must be full_attention"
    )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of one decoder; hashable, so it can be a static jit arg."""

  family: str  # "qwen2" | "qwen3" | "llama" | "qwen3_moe"
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 32768
  rope_scaling: RopeScaling | None = None
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  # Mixture of experts (family "qwen3_moe"; all 0 / defaults for dense models). A layer is
  # sparse when (layer + 1) % decoder_sparse_step == 0 and it is not in mlp_only_layers;
  # the other layers keep a dense MLP of `intermediate_size`.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  router_aux_loss_coef: float = 0.0  # read from and written to config.json; the loss is not here

  def __post_init__(self):
    if self.family not in _FAMILY_TO_ARCH:
      raise ConfigError(
        f"family: unsupported {self.family!r}; expected one of {sorted(_FAMILY_TO_ARCH)}"
      )
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
    ):
      if getattr(self, name) <= 0:
        raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
        f"num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}"
      )
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    if self.family != "qwen3_moe":
      if self.num_experts:
        raise ConfigError(f"num_experts: {self.family} is dense; experts need family qwen3_moe")
      return
    if self.num_experts <= 0 or self.moe_intermediate_size <= 0:
      raise ConfigError("num_experts, moe_intermediate_size: must be positive for qwen3_moe")
    if not 0 < self.num_experts_per_tok <= self.num_experts:
      raise ConfigError(
        f"num_experts_per_tok: {self.num_experts_per_tok} not in 1..{self.num_experts}"
      )
    if self.decoder_sparse_step <= 0:
      raise ConfigError(f"decoder_sparse_step: must be positive, got {self.decoder_sparse_step}")
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ConfigError(f"mlp_only_layers: {bad} not in 0..{self.num_layers - 1}")

  @property
  def qkv_bias(self) -> bool:
    return self.family == "qwen2"

  @property
  def qk_norm(self) -> bool:
    return self.family in ("qwen3", "qwen3_moe")

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  def sparse(self, layer: int) -> bool:
    """True when `layer` has a mixture of experts instead of the dense MLP."""
    return (
      self.is_moe
      and (layer + 1) % self.decoder_sparse_step == 0
      and layer not in self.mlp_only_layers
    )

  @property
  def num_sparse_layers(self) -> int:
    return sum(self.sparse(i) for i in range(self.num_layers))

  @property
  def architecture(self) -> str:
    return _FAMILY_TO_ARCH[self.family]

  # ------------------------------------------------------------------ HF I/O
  @classmethod
  def from_hf(cls, dir_or_dict: str | os.PathLike | Mapping[str, Any]) -> "ModelConfig":
    """Builds a config from an HF model directory or a parsed config.json.

    Every spelling in `HF_FIELDS` / `HF_MOE_FIELDS` is accepted (transformers 4 and 5
    write some fields under different names or nest them in `rope_parameters`)."""
    if isinstance(dir_or_dict, Mapping):
      hf = dict(dir_or_dict)
      where = "config"
    else:
      where = os.path.join(os.fspath(dir_or_dict), "config.json")
      if not os.path.exists(where):
        raise ConfigError(f"{where}: no config.json in this directory")
      with open(where) as f:
        hf = json.load(f)

    archs = _read(hf, where, "architectures", HFField(("architectures",)))
    arch = archs[0] if isinstance(archs, (list, tuple)) and archs else archs
    if arch not in ARCHITECTURES:
      raise ConfigError(
        f"{where}: architectures: unsupported {arch!r}; supported: {sorted(ARCHITECTURES)}"
      )
    family = ARCHITECTURES[arch]
    table = {**HF_FIELDS, **(HF_MOE_FIELDS if family == "qwen3_moe" else {})}
    fields: dict[str, Any] = {"family": family}
    for name, spec in table.items():
      fields[name] = _read(hf, where, name, spec, fields)
    _check_unsupported(hf, where, family, fields["num_layers"])
    fields["rope_scaling"] = _rope_scaling(hf, where)
    return cls(**fields)

  def to_hf(self, dtype: str = "float32") -> dict[str, Any]:
    """The config.json dict that transformers and vLLM load."""
    hf = {
      "architectures": [self.architecture],
      "model_type": self.family,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": self.rms_norm_eps,
      "rope_theta": self.rope_theta,
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "initializer_range": 0.02,
      "torch_dtype": dtype,
      "dtype": dtype,
      "use_cache": True,
      "attention_dropout": 0.0,
    }
    if self.family == "llama":
      hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if self.family in ("qwen3", "qwen3_moe"):
      hf["attention_bias"] = False
    if self.family == "qwen3_moe":
      hf.update(
        num_experts=self.num_experts,
        num_experts_per_tok=self.num_experts_per_tok,
        moe_intermediate_size=self.moe_intermediate_size,
        norm_topk_prob=self.norm_topk_prob,
        decoder_sparse_step=self.decoder_sparse_step,
        mlp_only_layers=list(self.mlp_only_layers),
        router_aux_loss_coef=self.router_aux_loss_coef,
        output_router_logits=False,
      )
    if self.family in ("qwen2", "qwen3", "qwen3_moe"):
      hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_layers)
    rope = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.rope_scaling is not None:
      rope = {
        "rope_type": "llama3",
        "rope_theta": self.rope_theta,
        **dataclasses.asdict(self.rope_scaling),
      }
      hf["rope_scaling"] = dict(rope)
    hf["rope_parameters"] = rope
    if self.bos_token_id is not None:
      hf["bos_token_id"] = self.bos_token_id
    if self.eos_token_id is not None:
      hf["eos_token_id"] = self.eos_token_id
    return hf
