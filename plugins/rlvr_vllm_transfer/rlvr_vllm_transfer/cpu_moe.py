"""In-place weight updates of unquantized mixture-of-experts layers on vLLM's CPU backend.

At start-up `CPUUnquantizedExperts.process_weights_after_loading` zero-pads the experts'
intermediate dimension to the kernel's tile multiple and replaces `w13_weight` and
`w2_weight` with the output of `cpu_prepack_moe_weight` (the grouped-gemm layout the
kernel reads). An in-place update (vLLM's layerwise reload, used by `reload_weights` and
by weight-transfer engines) restores each layer's checkpoint-shaped tensors, loads the
new weights into them and runs the layer's `process_weights_after_loading` again, then
copies the result into the served (packed) tensors. But `UnquantizedFusedMoEMethod.
_setup_kernel` calls the experts' own `process_weights_after_loading` (pad + prepack) only
on the first load: on an update the unpadded, unpacked tensors reach the copy, which
fails on the shape (padded layers) or silently writes checkpoint layout into packed
storage (the kernel then computes neither policy).

`install()` makes `_setup_kernel` re-run the experts' pad + prepack on updates too, so
the copy receives tensors in the kernel's layout. It patches the class once per process
and only on the CPU platform.
"""

from __future__ import annotations

import functools

_MARK = "_rlvr_cpu_moe_repack"


def install() -> None:
  from vllm.platforms import current_platform

  if not current_platform.is_cpu():
    return
  from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
  from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
  )

  original = UnquantizedFusedMoEMethod._setup_kernel
  if getattr(original, _MARK, False):
    return

  @functools.wraps(original)
  def _setup_kernel(self, layer, w13, w2):
    is_update = self.moe_kernel is not None
    original(self, layer, w13, w2)
    if is_update and self.unquantized_backend == UnquantizedMoeBackend.CPU:
      _check_reloading(layer)
      # The experts' own start-up step: pad the intermediate dim, then prepack.
      self.moe_kernel.fused_experts.process_weights_after_loading(layer)

  setattr(_setup_kernel, _MARK, True)
  UnquantizedFusedMoEMethod._setup_kernel = _setup_kernel


def _check_reloading(layer) -> None:
  """Prepacking is right only on freshly loaded checkpoint-layout tensors: those of a
  layerwise reload, where the served (packed) tensors are held aside to copy into."""
  from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

  info = LAYERWISE_INFO.get(layer)
  kernel = info.kernel_tensors[0] if info is not None and info.kernel_tensors else {}
  for name in ("w13_weight", "w2_weight"):
    served = kernel.get(name)
    if served is None or served is getattr(layer, name):
      raise RuntimeError(
        f"{type(layer).__name__}: MoE weights re-processed outside a layerwise reload; "
        "the CPU experts cannot re-pack them in place"
      )
