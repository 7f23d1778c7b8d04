"""Methods mixed into vLLM's worker (`LLM(worker_extension_cls=...)`) so the engine can load new weights in place.

vLLM imports this module inside its worker. With the engine core in the caller's process (the rollout engine's
default), `collective_rpc` hands the weights over by reference: the worker reads them straight from the
object-store buffer and no byte is serialised.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from tgc_rl.weight_sync.flat import Weights, named_tensors

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def with_tied_head(
    pairs: Iterable[tuple[str, torch.Tensor]], tied: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Add the output embedding of a tied model when the weights carry only the input embedding.

    vLLM's in-place reload treats the tied lm_head as its own layer: if no `lm_head.weight` arrives, that layer
    is not re-processed and, on CPU, keeps serving logits from its stale prepacked copy of the old embedding.
    """
    head = embed = None
    for name, tensor in pairs:
        if name == HEAD:
            head = tensor
        elif name == EMBED:
            embed = tensor
        yield name, tensor
    if tied and head is None and embed is not None:
        yield HEAD, embed


class WeightLoader:
    model_runner: GPUModelRunner  # provided by the vLLM worker this class is mixed into (CPU's subclasses it)

    def tgc_load_weights(self, weights: Weights) -> None:
        # reload_weights runs vLLM's layerwise reload: it fuses q/k/v and gate/up, then re-runs each layer's
        # post-load processing (on CPU: the oneDNN / AMX weight prepacking), so the model's own `load_weights`
        # (which fails on the already-packed CPU layers after the first load) is not used directly.
        hf_config = self.model_runner.model_config.hf_config
        tied = bool(getattr(hf_config.get_text_config(), "tie_word_embeddings", False))
        self.model_runner.reload_weights(weights_iterator=with_tied_head(named_tensors(weights), tied))
