"""Model configs shared by the benchmarks (random weights; nothing downloaded), their model
FLOPs, and the matmul peak that model-FLOPs utilisation is measured against."""

import time

CONFIGS = {
  # 27M-parameter Qwen2: the CPU benchmark size of bench/learner.py and bench/sampling.py.
  "27m": dict(
    family="qwen2",
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_layers=8,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
  ),
  # SmolLM2-135M-Instruct's shapes (the real job of configs/smollm2_arith.py and the TRL race).
  "smollm2": dict(
    family="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
  ),
  # Qwen2.5-1.5B shapes, for accelerator runs.
  "1.5b": dict(
    family="qwen2",
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
  ),
}


def model_flops_per_token(cfg, seq: int) -> float:
  """6 x (matmul params a token uses, incl. LM head: k of E experts in a sparse layer, plus
  its router) + causal-agnostic attention 12 L T d_attn."""
  d, f, l = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  attn_w = d * cfg.head_dim * (cfg.num_heads * 2 + cfg.num_kv_heads * 2)
  sparse = cfg.num_sparse_layers
  moe_w = d * cfg.num_experts + 3 * d * cfg.moe_intermediate_size * cfg.num_experts_per_tok
  dense = l * attn_w + (l - sparse) * 3 * d * f + sparse * moe_w + d * cfg.vocab_size
  return 6 * dense + 12 * l * seq * cfg.num_heads * cfg.head_dim


def matmul_peak(dtype) -> float:
  """Best FLOP/s of jitted square matmuls over several sizes and repeats, random inputs,
  f32 accumulation: an upper bound for what the step's matmuls can reach in this process,
  right now."""
  import jax
  import jax.numpy as jnp

  sizes = (512, 1024, 2048, 3072) if jax.default_backend() == "cpu" else (4096, 8192, 16384)
  best = 0.0
  for n in sizes:
    a, b = (jax.random.normal(jax.random.key(i), (n, n), dtype) for i in (0, 1))
    # f32 accumulation: in bf16 it is XLA's fast CPU kernel (AMX / AVX512-BF16, what the
    # learner's matmuls use); a bf16-output dot runs ~4x slower and would understate the peak.
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    for _ in range(10):
      t = time.perf_counter()
      f(a, b).block_until_ready()
      best = max(best, 2 * n**3 / (time.perf_counter() - t))
  return best


# An 85M-parameter Qwen3-MoE of the 27M model's shapes (about 28M active: 16 experts, 4 per
# token; Qwen3-30B-A3B's 128 / 8 scaled down), the MoE learner benchmark's size.
CONFIGS["moe"] = dict(
  CONFIGS["27m"],
  family="qwen3_moe",
  num_experts=16,
  num_experts_per_tok=4,
  moe_intermediate_size=384,
  norm_topk_prob=True,
)


# HF config.json fields (shapes only) of the models the paper configs train, for
# bench/plan.py: parameters never exist, the update step is only compiled.
_QWEN2 = dict(
  architectures=["Qwen2ForCausalLM"],
  rope_theta=1e6,
  rms_norm_eps=1e-6,
  max_position_embeddings=32768,
)
PAPER_MODELS = {
  "qwen25_3b": dict(
    _QWEN2,
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  ),
  "qwen25_32b": dict(
    _QWEN2,
    vocab_size=152064,
    hidden_size=5120,
    intermediate_size=27648,
    num_hidden_layers=64,
    num_attention_heads=40,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
  ),
  "qwen3_4b": dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
  ),
  "qwen25_7b": dict(  # Qwen2.5-7B-Instruct (SvS on code)
    _QWEN2,
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
    rope_theta=1e6,
    max_position_embeddings=32768,
  ),
  "qwen25_math_7b": dict(
    _QWEN2,
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    max_position_embeddings=4096,
  ),
  "llama31_8b": dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    rope_scaling=dict(
      rope_type="llama3",
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=8192,
    ),
  ),
  "qwen3_8b": dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
  ),
  "qwen3_14b": dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
  ),
  # Mixture of experts: 128 experts of which 8 per token, every layer sparse (3.3B active).
  "qwen3_30b_a3b": dict(
    architectures=["Qwen3MoeForCausalLM"],
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    tie_word_embeddings=False,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    router_aux_loss_coef=0.001,
  ),
}
