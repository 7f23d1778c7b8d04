"""The learner's process group and FSDP2 sharding: one code path for gloo CPU ranks and NCCL GPU ranks.

Precision: parameters are kept sharded in float32 (the master weights; AdamW's moments follow them in
float32) and FSDP2's `MixedPrecisionPolicy` all-gathers them in the compute dtype (bf16 where the hardware
has it) for forward/backward, then reduce-scatters gradients in float32. So no separate master copy is
needed and the optimizer never sees bf16 rounding.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

# Generous: gloo collectives on a loaded 2-core machine can stall for a while, but a dead peer must
# still surface as an error rather than a hang.
COLLECTIVE_TIMEOUT = timedelta(minutes=int(os.environ.get("TGC_LEARNER_TIMEOUT_MIN", "15")))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def learner_device(gpus_per_learner: float) -> torch.device:
    """CUDA when the spec asks for GPUs and one is visible, else CPU. Ray sets CUDA_VISIBLE_DEVICES per
    actor, so the learner's GPU is the current device."""
    if gpus_per_learner > 0:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "resources.gpus_per_learner > 0 but this process sees no CUDA device; set "
                "gpus_per_learner: 0 to train on CPU"
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_process_group(
    rank: int, world_size: int, device: torch.device, master_addr: str, master_port: int | None
) -> DeviceMesh:
    """Join (or reuse) the default process group: NCCL on GPU, gloo on CPU; returns a 1-D mesh."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        # One default group per process: a second Learner in the same process (tests, evaluation) reuses it.
        if dist.get_world_size() != world_size or dist.get_rank() != rank or dist.get_backend() != backend:
            raise RuntimeError(
                f"this process already belongs to a {dist.get_backend()} group as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}; a Learner with rank {rank} of {world_size} needs its own process"
            )
    else:
        if master_port is None:
            if world_size > 1:
                raise ValueError("master_port is required when world_size > 1 (all ranks must agree on it)")
            master_port = free_port(master_addr)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )
    return init_device_mesh(device.type, (world_size,))


def bf16_supported(device: torch.device) -> bool:
    """bf16 compute is native: CUDA with bf16 units, or a CPU with AVX512-BF16/AMX (else it is emulated, slow)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and check() for check in checks)


def compute_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "bfloat16" and bf16_supported(device):
        return torch.bfloat16
    return torch.float32


def shard(module: nn.Module, layers: list[nn.Module], mesh: DeviceMesh, dtype: torch.dtype) -> None:
    """fully_shard each decoder layer, then the root (embedding, final norm and head live in the root unit).

    Gradients are summed over ranks, not averaged: the loss of every micro-batch is already divided by the
    whole step's normaliser (rlcore.StepNorm), so the sum over ranks is the full-batch gradient.

    On one rank a shard is the whole weight: resharding after forward would only free the compute-dtype copy
    to gather (cast and copy) it again for backward, so the copy is kept until backward is done.
    """
    mp = MixedPrecisionPolicy(
        param_dtype=dtype if dtype != torch.float32 else None, reduce_dtype=torch.float32
    )
    reshard = mesh.size() > 1
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    if mesh.size() == 1:  # nothing to reduce; a divide factor (even 1.0) would add a divide and a copy
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM


def sync_after_backward(module: nn.Module, sync: bool) -> None:
    """Whether the next backward reduces gradients and reshards weights (True), or keeps the gathered weights
    and accumulates unsharded float32 gradients for a later micro-batch of the same optimizer step (False)."""
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_requires_gradient_sync(sync, recurse=False)
            m.set_reshard_after_backward(sync, recurse=False)


def reshard(module: nn.Module) -> None:
    """Free every gathered weight, e.g. after a no-grad pass on one rank, where forward keeps them: the next
    forward gathers the weights the optimizer has updated since."""
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor from a sharded DTensor (a collective: every rank must call it in the same order)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
