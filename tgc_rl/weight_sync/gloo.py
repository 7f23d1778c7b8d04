"""A gloo backend for vLLM's native weight-transfer protocol, so the broadcast path of `broadcast.py` runs on CPU.

On GPUs the learner broadcasts with vLLM's NCCL engine. Here the same protocol (init -> start -> update ->
finish, driven through `ReplicaSyncClient`, each replica at its own rank offset, layerwise in-place reload
inside vLLM) runs with a gloo process group instead, so CI exercises everything of that path but the
communicator. It also serves CPU clusters where the learner and the replicas sit on different nodes.

Worker side: `GlooWeightTransferEngine`, registered with vLLM as backend "tgc_gloo" (in-process engine core:
registering in the actor process before the LLM is built is enough). Trainer side: `GlooSender`.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND = "tgc_gloo"
TIMEOUT = timedelta(minutes=10)


@dataclass
class GlooInitInfo:
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int


@dataclass
class GlooUpdateInfo:
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


def _group(info: GlooInitInfo, rank: int, is_master: bool) -> dist.ProcessGroupGloo:
    # A group of its own (no torch.distributed global state): the learner's FSDP group is untouched.
    store = dist.TCPStore(
        info.master_address,
        info.master_port,
        info.world_size,
        is_master=is_master,
        timeout=TIMEOUT,
        wait_for_workers=False,
    )
    return dist.ProcessGroupGloo(dist.PrefixStore("tgc-weights", store), rank, info.world_size, TIMEOUT)


def register() -> None:
    """Make "tgc_gloo" a vLLM weight-transfer backend in this process (idempotent)."""
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND in WeightTransferEngineFactory._registry:
        return

    # vLLM's bases, mixed in here so the sender's process need not import vLLM
    @dataclass
    class InitInfo(GlooInitInfo, WeightTransferInitInfo):
        pass

    @dataclass
    class UpdateInfo(GlooUpdateInfo, WeightTransferUpdateInfo):
        pass

    class GlooWeightTransferEngine(WeightTransferEngine[InitInfo, UpdateInfo]):
        init_info_cls = InitInfo
        update_info_cls = UpdateInfo
        group: dist.ProcessGroupGloo | None = None

        def init_transfer_engine(self, init_info: InitInfo) -> None:
            self.group = _group(init_info, init_info.rank_offset + self.parallel_config.rank, is_master=False)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # CPU: nothing to synchronise

        def receive_weights(self, update_info: UpdateInfo) -> None:
            from tgc_rl.weight_sync.vllm_loader import with_tied_head

            group = self.group
            if group is None:
                raise RuntimeError(
                    "gloo weight transfer not initialised: call init_weight_transfer_engine first"
                )

            def received():  # one tensor at a time, as vLLM's loader asks for it
                for name, dtype, shape in zip(
                    update_info.names, update_info.dtype_names, update_info.shapes, strict=True
                ):
                    buf = torch.empty(shape, dtype=getattr(torch, dtype))
                    group.broadcast(buf, 0).wait()
                    yield name, buf

            tied = bool(getattr(self.model_config.hf_config.get_text_config(), "tie_word_embeddings", False))
            # vLLM types self.model as nn.Module; its models all define load_weights
            self.model.load_weights(with_tied_head(received(), tied))  # type: ignore[operator]

        def shutdown(self) -> None:
            self.group = None

    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


class GlooSender:
    """The learner's end (rank 0): opens the group with every replica, then broadcasts full state dicts."""

    def __init__(self, client, master_address: str, master_port: int):
        self.client = client
        info = GlooInitInfo(master_address, master_port, rank_offset=1, world_size=client.world_size)
        with ThreadPoolExecutor(max_workers=1) as pool:
            # the replicas block in their rendezvous until rank 0 joins: run both sides at once
            joining = pool.submit(client.init_weight_transfer_engine, asdict(info))
            self.group = _group(info, 0, is_master=True)
            joining.result()

    def send(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        tensors = [t.detach().to("cpu").contiguous() for t in state_dict.values()]
        update = GlooUpdateInfo(
            list(state_dict),
            [str(t.dtype).removeprefix("torch.") for t in tensors],
            [list(t.shape) for t in tensors],
        )
        self.client.version = version
        self.client.start_weight_update()
        with ThreadPoolExecutor(max_workers=1) as pool:
            receiving = pool.submit(self.client.update_weights, asdict(update))
            for t in tensors:
                self.group.broadcast(t, 0).wait()  # type: ignore[attr-defined]  # torch's stub omits Backend.broadcast
            receiving.result()
        self.client.finish_weight_update()
