"""`resources.weight_sync: broadcast`: learner rank 0 sends each step's weights straight into every vLLM rollout
replica, through vLLM's native weight-transfer API (init_weight_transfer_engine -> start_weight_update ->
update_weights -> finish_weight_update).

The object-store path (tgc_rl/weight_sync/flat.py) costs a device->host copy on the learner and host->device
on every replica on GPUs; this one moves the weights GPU to GPU with vLLM's own trainer-side NCCL engine, and
runs the same protocol over gloo on CPU (tgc_rl/weight_sync/gloo.py), which is how the tests exercise it.
This module only adapts our replicas and learner ranks to that protocol (tgc_rl/weight_sync/sync.py drives it):

    client = pool.sync_client()                                   # a ReplicaSyncClient; picklable
    learner_group.open_broadcast(functools.partial(BroadcastSender, client))   # every rank builds its sender
    sender.send(learner, version)                                 # every step, on every rank; rank 0 sends

Each replica is its own vLLM instance, so it joins the broadcast group at its own rank offset (vLLM's
trainer engine assumes one instance at offset 1). A replica restarted after a crash is not in the group and
starts from the pool's last object-store weights, so WeightSync syncs through the object store after a
restart (or a failed broadcast) and then opens the group again.
"""

from __future__ import annotations

from typing import Any

import ray


def weight_transfer_config(backend: str):
    from vllm.config import WeightTransferConfig

    return WeightTransferConfig(backend=backend)


def rank_offsets(replicas: int, ranks_per_replica: int) -> list[int]:
    """First broadcast rank of each replica; rank 0 is the learner's sender."""
    if replicas < 1 or ranks_per_replica < 1:
        raise ValueError("rank_offsets: replicas and ranks_per_replica must be >= 1")
    return [1 + i * ranks_per_replica for i in range(replicas)]


class ReplicaSyncClient:
    """vLLM's `VLLMWeightSyncClient` protocol (four methods) over a pool's rollout actors."""

    def __init__(self, actors: list[Any], ranks_per_replica: int = 1):
        self.actors = list(actors)
        self.offsets = rank_offsets(len(self.actors), ranks_per_replica)
        self.world_size = 1 + len(self.actors) * ranks_per_replica
        self.version: int | None = None  # stamped on the replicas' engines when an update finishes

    def _all(self, op: str, payloads: list[Any] | None = None, version: int | None = None) -> None:
        payloads = payloads or [None] * len(self.actors)
        ray.get(
            [a.weight_transfer.remote(op, p, version) for a, p in zip(self.actors, payloads, strict=True)]
        )

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        # vLLM's trainer engine writes rank_offset=1 for a single instance; give each replica its own slot
        self._all(
            "init", [{**init_info, "rank_offset": off, "world_size": self.world_size} for off in self.offsets]
        )

    def start_weight_update(self) -> None:
        self._all("start")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._all("update", [update_info] * len(self.actors))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish", version=self.version)


def make_sender(client: ReplicaSyncClient, model, master_address: str, master_port: int, rank: int):
    """vLLM's trainer-side NCCL engine over `model`'s parameters (FSDP2 DTensors are gathered one by one).

    Call on every learner rank; rank 0 opens the group with all replicas and sends."""
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    info = NCCLTrainerInitInfo(
        master_address=master_address, master_port=master_port, world_size=client.world_size, rank=rank
    )
    return NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=ModuleSource(model))


class BroadcastSender:
    """The learner's end of the broadcast, one per learner rank; every rank takes part (FSDP2 weights are
    gathered collectively) and rank 0 sends. On GPU: vLLM's NCCL trainer engine over the model's parameters;
    on CPU: the full state dict over gloo (`GlooSender`).

        make = functools.partial(BroadcastSender, client)   # picklable, sent to every rank with address, port
        sender = make(address, port, rank, learner); sender.send(learner, version)   # on each rank
    """

    def __init__(
        self, client: ReplicaSyncClient, master_address: str, master_port: int, rank: int, learner: Any
    ):
        self.client = client
        self.gpu = learner.device.type == "cuda"
        if self.gpu:
            self.engine = make_sender(client, learner.policy, master_address, master_port, rank)
        elif rank == 0:
            from tgc_rl.weight_sync.gloo import GlooSender

            self.engine = GlooSender(client, master_address, master_port)
        else:
            self.engine = None

    def send(self, learner: Any, version: int) -> None:
        if self.gpu:
            self.client.version = version  # stamped on the replicas when vLLM's engine finishes the update
            self.engine.send_weights()
            return
        state = learner.full_state_dict()  # collective: rank 0 gets the weights, the other ranks {}
        if self.engine is not None:
            self.engine.send(state, version)
