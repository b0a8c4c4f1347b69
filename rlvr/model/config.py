"""Decoder hyper-parameters, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

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
    """Builds a config from an HF model directory or a parsed config.json."""
    if isinstance(dir_or_dict, Mapping):
      hf = dict(dir_or_dict)
      where = "config"
    else:
      where = os.path.join(os.fspath(dir_or_dict), "config.json")
      if not os.path.exists(where):
        raise ConfigError(f"{where}: no config.json in this directory")
      with open(where) as f:
        hf = json.load(f)

    def need(key):
      if key not in hf or hf[key] is None:
        raise ConfigError(f"{where}: missing required field {key!r}")
      return hf[key]

    archs = need("architectures")
    arch = archs[0] if isinstance(archs, (list, tuple)) and archs else archs
    if arch not in ARCHITECTURES:
      raise ConfigError(
        f"{where}: architectures: unsupported {arch!r}; supported: {sorted(ARCHITECTURES)}"
      )
    family = ARCHITECTURES[arch]
    num_heads = need("num_attention_heads")
    hidden = need("hidden_size")
    head_dim = hf.get("head_dim") or hidden // num_heads
    if family == "qwen2" and hf.get("attention_bias") is False:
      raise ConfigError(f"{where}: attention_bias: Qwen2 without qkv bias is not supported")
    if family == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
      raise ConfigError(f"{where}: attention_bias/mlp_bias: Llama with biases is not supported")
    # transformers 5 moved rope settings into `rope_parameters`; accept both.
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
      try:
        scaling = RopeScaling(
          factor=float(rope["factor"]),
          low_freq_factor=float(rope["low_freq_factor"]),
          high_freq_factor=float(rope["high_freq_factor"]),
          original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
      except KeyError as e:
        raise ConfigError(f"{where}: rope_scaling: missing field {e.args[0]!r}") from None
    elif rope_type not in ("default", None):
      raise ConfigError(
        f"{where}: rope_scaling.rope_type: unsupported {rope_type!r}; supported: default, llama3"
      )
    eos = hf.get("eos_token_id")
    if isinstance(eos, list):
      eos = eos[0] if eos else None
    moe = {}
    if family == "qwen3_moe":
      moe = dict(
        num_experts=int(need("num_experts")),
        num_experts_per_tok=int(need("num_experts_per_tok")),
        moe_intermediate_size=int(need("moe_intermediate_size")),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        decoder_sparse_step=int(hf.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
      )
    return cls(
      family=family,
      vocab_size=need("vocab_size"),
      hidden_size=hidden,
      intermediate_size=need("intermediate_size"),
      num_layers=need("num_hidden_layers"),
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=head_dim,
      rope_theta=float(rope_theta),
      rms_norm_eps=float(need("rms_norm_eps")),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
      rope_scaling=scaling,
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=eos,
      **moe,
    )

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
