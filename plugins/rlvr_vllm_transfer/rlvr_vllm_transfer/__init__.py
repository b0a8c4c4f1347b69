"""vLLM plugin: registers the `rlvr_tcp` weight-transfer engine by name, and on CPU
makes in-place weight updates of MoE layers re-pack their experts (see `cpu_moe`).

vLLM calls `register()` (entry point group `vllm.general_plugins`) in each of its
processes, possibly more than once; the engine module is imported only when a server
started with `--weight-transfer-config '{"backend": "rlvr_tcp"}'` creates it. The MoE
fix applies to every in-place update (`reload_weights` from disk as well as transfers).
"""

BACKEND = "rlvr_tcp"


def register() -> None:
  from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

  if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(
      BACKEND, "rlvr_vllm_transfer.tcp_engine", "TcpWeightTransferEngine"
    )
  from rlvr_vllm_transfer import cpu_moe

  cpu_moe.install()
