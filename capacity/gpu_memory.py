"""GPU memory vLLM can actually budget, per GPU model (docs/sources.md §12).

A GPU sold as "48 GB" does not give vLLM 48 GiB. vLLM sizes everything from the total that
CUDA reports (``torch.cuda.mem_get_info()``: weights, activations and the KV cache must fit in
``gpu_memory_utilization`` x that total), and that total is below the datasheet figure:
``nvidia-smi`` already shows less (an L40S 46,068 MiB = 44.99 GiB, an H100 81,559 MiB =
79.65 GiB; ECC and the driver take their share), and CUDA less again (the driver's
per-process reservation).

The figures are what PyTorch prints as "GPU 0 has a total capacity of X GiB" on that GPU,
taken from public vLLM issue reports (one source each in ``source``). They move a little with
the driver version (H100 reports 79.11 to 79.19 GiB): the table keeps the lowest found, so the
planner errs on the side of "does not fit".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU model.

    Attributes:
        datasheet_gb: the memory on NVIDIA's datasheet, as printed ("48 GB").
        nvidia_smi_mib: ``memory.total`` as ``nvidia-smi`` reports it, MiB (None if no report
            was found).
        cuda_total_gib: the total CUDA (and so PyTorch and vLLM) reports, GiB (2^30 B): the
            base of vLLM's ``--gpu-memory-utilization``.
        source: where ``cuda_total_gib`` (and ``nvidia_smi_mib``) come from.
    """

    datasheet_gb: float
    nvidia_smi_mib: int | None
    cuda_total_gib: float
    source: str


#: GPU model (as ``platform_config.instances.InstanceType.gpu_model`` spells it) -> memory.
GPU_MEMORY: dict[str, GpuMemory] = {
    "NVIDIA L40S": GpuMemory(
        48.0, 46068, 44.53,
        "NVIDIA L40S datasheet (48 GB GDDR6); vllm-project/vllm#15598 (8 x L40S nodes: 'total capacity of "
        "44.53 GiB'); akash-network/provider-configs#99 (nvidia-smi: 'NVIDIA L40S, ..., 46068 MiB')"),
    "NVIDIA H100": GpuMemory(
        80.0, 81559, 79.11,
        "NVIDIA H100 SXM datasheet (80 GB HBM3); vllm-project/vllm#27508 (H100: 'total capacity of 79.11 GiB'); "
        "LMCache/LMCache#259 (nvidia-smi: 'NVIDIA H100 80GB HBM3 ... 81559MiB')"),
    "NVIDIA H200": GpuMemory(
        141.0, None, 139.81,
        "NVIDIA H200 datasheet (141 GB HBM3e); vllm-project/vllm#34553 (8 x H200: 'NVIDIA H200 (139.81 GiB)')"),
}


def usable_gpu_memory_gib(gpu_model: str) -> float:
    """GiB per GPU that vLLM's ``--gpu-memory-utilization`` applies to (see the module docstring).

    Raises:
        KeyError: a GPU model without an entry; the message lists the known ones.
    """
    try:
        return GPU_MEMORY[gpu_model].cuda_total_gib
    except KeyError:
        raise KeyError(f"no usable-memory figure for GPU {gpu_model!r}; known: {', '.join(GPU_MEMORY)} "
                       "(add one to capacity/gpu_memory.py with its source)") from None
