"""Model configs shared by the benchmarks (random weights; nothing downloaded)."""

CONFIGS = {
    # 27M-parameter Qwen2: the CPU benchmark size of the learner and sampler issues.
    "27m": dict(family="qwen2", vocab_size=8192, hidden_size=512, intermediate_size=1408,
                num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
                tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6),
    # Qwen2.5-1.5B shapes, for accelerator runs.
    "1.5b": dict(family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                 num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                 tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6),
}
