"""The learner's settings and input: `LearnerConfig` (optimiser, loss, memory knobs) and
`TrainBatch` (one update's arrays)."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from rlvr import objectives
from rlvr.common import settings
from rlvr.model import attention, decoder
from rlvr.model.lora import LoraConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# The fields of a learner that only RL reads (SFT has no advantages, mini-batches of groups,
# old log-probs or packing): an SFT learner that sets one is refused at launch.
RL_ONLY = (
  "advantage",
  "normalize_std",
  "adv_std_ddof",
  "ppo_mini_batch_size",
  "ppo_epochs",
  "old_logp",
  "pack",
  "pack_len",
  "pack_min_rows",
)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Optimiser and loss settings (defaults: SvS's public settings,
  docs/methods.md#grpo-settings)."""

  learning_rate: float = 1e-6
  lr_schedule: str = "constant"  # "constant" | "cosine" (linear warmup, cosine decay)
  warmup_steps: int = 0
  total_steps: int = settings.derived(1000, ".steps")  # cosine horizon: the phase's steps
  # (sft.steps, rl.steps), filled at launch
  min_lr_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  adam_eps: float = 1e-8
  grad_clip: float = 1.0  # global-norm clip; <= 0 disables
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float | None = 3.0
  aggregation: str = "token-mean"
  kl_beta: float = 0.0  # > 0 keeps a frozen reference model
  kl_estimator: str = "k3"
  micro_batches: int = 0  # micro-batches per update; 0: the fewest whose temporaries the
  # compiler plans within micro_memory_gb (`update.make_update_fn`), chosen per batch shape
  micro_batch_rows: int = 0  # > 0: rows per micro-batch instead (the count then
  # follows the batch, as packed batches vary in rows)
  micro_memory_gb: float = 0.0  # with micro_batches=0: the most the update's temporaries
  # may take; 0: 2 GiB on CPU, 3/4 of what the state leaves on an accelerator
  remat: bool = False
  remat_policy: str = "nothing"  # with remat: "nothing" saved per layer, or "dots"
  accumulate_in_backward: bool = False  # the layer scan's backward pass adds each layer's
  # gradient into the micro-batch accumulator in place (`model.grad_accum`): one full
  # gradient in memory instead of two; the same sums; every layer is recomputed (as remat)
  compute_dtype: str = "float32"  # params stay f32 (master); forward in this dtype
  mask_truncated: bool = False  # drop length-truncated completions from the loss
  normalize_all: bool = False  # loss normaliser counts masked truncated completions
  # too (QbQ Eq. 2 divides by all m completions)
  policy_loss: str = "grpo"  # "grpo" | "gspo" | "gspo_token" | "cispo" (objectives.POLICY_LOSSES),
  # or "package.module:function" for a loss defined elsewhere
  tis_cap: float | None = None  # truncated IS weight min(exp(old - sampler), C)
  tis_level: str = "token"  # "token": one weight per token; "sequence": the geometric
  # mean of the sequence's token ratios, one weight per sequence
  seq_mask_cap: float | None = None  # M: drop a sequence from the loss when its geometric
  # mean ratio exp(mean_t (old - sampler)) leaves [1/M, M] (logged: seq_masked_frac)
  moe_aux_loss_coef: float = 0.0  # mixture of experts: weight of the load-balancing loss
  # (`moe.load_balance_loss`; Qwen3-MoE's own training used 1e-3); 0: off
  moe_z_loss_coef: float = 0.0  # weight of the router z-loss (`moe.router_z_loss`); 0: off
  routing_replay: bool = False  # the sparse layers use the experts the sampler routed each
  # token to (batch.routes_bt), not their own top-k (R3); the router keeps its gradient
  logits_chunk: int = 256  # positions per logits block in the loss, at most
  logits_block_mb: int = 256  # and at most this many MiB per [rows, positions, vocab] f32
  # block (a 49K vocabulary at 32 rows: 42 positions)
  attention: str = "auto"  # "auto" (blockwise at long T), "dense", "blockwise",
  # "cudnn" (GPU flash attention, right-padded rows)
  scan_layers: bool = True  # False: layers unrolled (faster on CPU for small
  # models, compile time grows with depth)
  lora: LoraConfig = LoraConfig()  # rank > 0: train LoRA adapters on a frozen base
  # How a buffer of scored groups becomes optimizer steps (RL only: `RL_ONLY`).
  advantage: str = "grpo"  # "grpo" | "dr_grpo" | "rloo" | "reinforce++" |
  # "reinforce++_baseline" (objectives.ADVANTAGES), or "package.module:function"
  normalize_std: bool = True  # False with advantage "grpo": the "dr_grpo" estimator
  adv_std_ddof: int = 1  # std as verl / TRL take it (torch.std, unbiased); 0: population
  ppo_mini_batch_size: int = 0  # groups (prompts) per optimizer step, as verl's
  # ppo_mini_batch_size; 0: the whole buffer in one step
  ppo_epochs: int = 1  # passes over a buffer's mini-batches
  old_logp: str = "learner"  # old policy of a multi-step update: "learner" (recomputed
  # once per rollout batch, as verl) or "sampler" (its logprobs)
  pack: bool = False  # the update packs several sequences per row (verl's
  # remove-padding, TRL's padding-free)
  pack_len: int = 0  # packed row length (0: seq_len, the longest sequence)
  pack_min_rows: int = 8  # packed row counts: powers of two >= this (a multiple of
  # data-parallel devices x learner micro-batch rows)

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate: must be > 0, got {self.learning_rate}")
    for name in ("warmup_steps", "total_steps", "weight_decay", "min_lr_ratio", "kl_beta"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name}: must be in [0, 1), got {getattr(self, name)}")
    if not self.adam_eps > 0 or self.logits_chunk < 1:
      raise ValueError(
        f"adam_eps / logits_chunk: must be > 0 / >= 1, got {self.adam_eps} / {self.logits_chunk}"
      )
    if self.lr_schedule not in ("constant", "cosine"):
      raise ValueError(f"lr_schedule: unknown {self.lr_schedule!r}; expected constant|cosine")
    if self.aggregation not in objectives.AGGREGATIONS:
      raise ValueError(
        f"aggregation: unknown {self.aggregation!r}; expected {objectives.AGGREGATIONS}"
      )
    if self.kl_estimator not in ("k1", "k3"):
      raise ValueError(f"kl_estimator: unknown {self.kl_estimator!r}; expected k1|k3")
    if self.attention not in attention.IMPLEMENTATIONS:
      raise ValueError(
        f"attention: unknown {self.attention!r}; expected one of {attention.IMPLEMENTATIONS}"
      )
    if self.remat_policy not in decoder.REMAT_POLICIES:
      raise ValueError(
        f"remat_policy: unknown {self.remat_policy!r}; expected one of {decoder.REMAT_POLICIES}"
      )
    if self.compute_dtype not in DTYPES:
      raise ValueError(f"compute_dtype: unknown {self.compute_dtype!r}; expected {list(DTYPES)}")
    if self.micro_batches < 0 or self.micro_batch_rows < 0 or self.micro_memory_gb < 0:
      raise ValueError(
        f"micro_batches / micro_batch_rows / micro_memory_gb: must be >= 0, got "
        f"{self.micro_batches} / {self.micro_batch_rows} / {self.micro_memory_gb}"
      )
    if self.logits_block_mb < 1:
      raise ValueError(f"logits_block_mb: must be >= 1, got {self.logits_block_mb}")
    if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
      raise ValueError(f"eps_low/eps_high: bad clip range {self.eps_low}/{self.eps_high}")
    if self.dual_clip is not None and self.dual_clip <= 1:
      raise ValueError(f"dual_clip: must be > 1, got {self.dual_clip}")
    if self.tis_cap is not None and self.tis_cap <= 0:
      raise ValueError(f"tis_cap: must be > 0, got {self.tis_cap}")
    if self.tis_level not in objectives.TIS_LEVELS:
      raise ValueError(
        f"tis_level: unknown {self.tis_level!r}; expected one of {objectives.TIS_LEVELS}"
      )
    if not self.normalize_std and self.advantage not in ("grpo", "dr_grpo"):
      raise ValueError(
        f"normalize_std: False is the 'dr_grpo' estimator; advantage={self.advantage!r} "
        "takes normalize_std=True"
      )
    objectives.advantage_fn(self.advantage)  # a one-line error naming the known estimators
    if self.adv_std_ddof not in (0, 1):
      raise ValueError(f"adv_std_ddof: expected 0 or 1, got {self.adv_std_ddof}")
    if self.ppo_mini_batch_size < 0 or self.ppo_epochs < 1:
      raise ValueError(
        f"ppo_mini_batch_size / ppo_epochs: must be >= 0 (0 = whole buffer) / >= 1, got "
        f"{self.ppo_mini_batch_size} / {self.ppo_epochs}"
      )
    if self.old_logp not in ("learner", "sampler"):
      raise ValueError(f"old_logp: unknown {self.old_logp!r}; expected learner|sampler")
    if self.pack_len < 0 or self.pack_min_rows < 1:
      raise ValueError(
        f"pack_len / pack_min_rows: must be >= 0 / >= 1, got {self.pack_len} / {self.pack_min_rows}"
      )
    if self.moe_aux_loss_coef < 0 or self.moe_z_loss_coef < 0:
      raise ValueError(
        f"moe_aux_loss_coef / moe_z_loss_coef: must be >= 0, got "
        f"{self.moe_aux_loss_coef} / {self.moe_z_loss_coef}"
      )
    if self.seq_mask_cap is not None and not self.seq_mask_cap > 1:
      raise ValueError(f"seq_mask_cap: must be > 1, got {self.seq_mask_cap}")
    objectives.policy_loss_fn(self.policy_loss)  # a one-line error naming the known losses
    if self.accumulate_in_backward and (
      self.lora.rank or not self.scan_layers or self.remat_policy != "nothing"
    ):
      raise ValueError(
        "accumulate_in_backward: needs the stacked layer scan and full fine-tuning, and "
        "recomputes every layer whole (scan_layers=True, lora.rank=0, remat_policy='nothing'),"
        f" got scan_layers={self.scan_layers}, lora.rank={self.lora.rank}, "
        f"remat_policy={self.remat_policy!r}"
      )
    if not isinstance(self.lora, LoraConfig):
      raise ValueError(
        f"lora: expected a rlvr.model.lora.LoraConfig, got {type(self.lora).__name__}"
      )

  @property
  def advantage_estimator(self) -> str:
    """The `objectives.ADVANTAGES` name in effect: `advantage`, or "dr_grpo" for "grpo" with
    normalize_std False."""
    return "dr_grpo" if self.advantage == "grpo" and not self.normalize_std else self.advantage

  @property
  def auto_micro(self) -> bool:
    """The update picks its micro-batch count from the compiler's memory plan."""
    return not self.micro_batches and not self.micro_batch_rows

  def micro_count(self, rows: int) -> int:
    """Micro-batches a batch of `rows` rows is split into (1 when picked automatically and
    not yet picked: `update.make_update_fn` sets micro_batches for each batch shape)."""
    if not self.micro_batch_rows:
      return max(self.micro_batches, 1)
    if rows % self.micro_batch_rows:
      raise ValueError(
        f"micro_batch_rows: a batch of {rows} rows does not split into "
        f"micro-batches of {self.micro_batch_rows}"
      )
    return rows // self.micro_batch_rows


@flax.struct.dataclass
class TrainBatch:
  """One update's data; every field has the batch as leading dimension.

  `*_bt` fields are target-aligned (see `rlvr.objectives`). old_logp_bt None means
  on-policy: the old policy is the current one (ratio 1, gradient flows).
  sampler_logp_bt: the sampler's logprobs, for mismatch metrics and TIS.
  A packed batch (`packing.pack_rows(..., bins=...)`: several sequences per row) has
  segment ids 1, 2, ... within a row, RoPE positions that restart with each
  sequence, and per-token advantages and truncation flags ([B, T] instead of [B]).
  """

  tokens_bt: jax.Array
  segment_bt: jax.Array  # sequence id within the row (1, 2, ...), 0 on padding
  loss_mask_bt: jax.Array  # 1 on completion tokens in the loss
  advantages: jax.Array  # [B], or [B, T] in a packed batch
  old_logp_bt: jax.Array | None = None
  sampler_logp_bt: jax.Array | None = None
  truncated: jax.Array | None = None  # [B], or [B, T] in a packed batch
  positions_bt: jax.Array | None = None  # packed batches; None: counted from segment_bt
  routes_bt: jax.Array | None = None  # mixture of experts: [B, T, S, k] the sampler's
  # experts per input token (-1: none), for routing replay and the mismatch metric
  loss_positions_bk: jax.Array | None = None  # [B, K] where each row's loss tokens are
  # (`packing.loss_positions`): the LM head runs there only; None: at every position

  @property
  def packed(self) -> bool:
    return self.positions_bt is not None

  @property
  def sequences_bt(self) -> jax.Array | None:
    """Sequence ids within each row for per-sequence sums (`objectives.aggregate`): the
    segment ids of a packed batch; None when every row is one sequence."""
    return self.segment_bt if self.packed else None
