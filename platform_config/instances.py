"""Facts about the SageMaker HyperPod instance types this project plans and validates for.

One table, shared by config validation (does a replica's GPU request fit its instance type?)
and by the capacity planner (``kv_tools.planner``). Units are spelled out in every field name:
``gpu_memory_gib`` is GiB of HBM per GPU, ``host_memory_gib`` GiB of DRAM per instance,
``nvme_gb`` decimal GB of local instance storage per instance (AWS quotes NVMe in GB).

Sources: Amazon EC2 accelerated-computing instance specifications for G6e
(https://aws.amazon.com/ec2/instance-types/g6e/) and P5
(https://aws.amazon.com/ec2/instance-types/p5/), as listed in 2026; GPU memory as marketed by
NVIDIA (L40S 48 GB, H100 80 GB, H200 141 GB). What CUDA really exposes of it (an L40S about
44.5 GiB) is in :mod:`kv_tools.gpu_memory`, sourced; the planner's fit rule uses that, not the
marketed size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class InstanceType:
    """Hardware of one ``ml.*`` instance type.

    Attributes:
        name: SageMaker instance type, e.g. ``ml.g6e.12xlarge``.
        gpu_model: Marketing name of the accelerator, e.g. ``NVIDIA L40S``.
        gpus: Number of GPUs per instance.
        gpu_memory_gib: Memory per GPU, GiB (nominal).
        vcpus: vCPUs per instance.
        host_memory_gib: System memory per instance, GiB.
        nvme_gb: Local NVMe instance storage per instance, decimal GB (AWS convention).
        gpu_peak_bf16_tflops: Dense (no sparsity) BF16/FP16 tensor-core peak per GPU, TFLOP/s,
            from NVIDIA's datasheets: L40S 362.05, H100 SXM 989.4, H200 989.4 (the sheets'
            larger "with sparsity" figures are twice these). Used by ``kv_tools.planner``
            to scale the prefill rate calibrated on the reference run (an L40S) to other GPUs.
    """

    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    host_memory_gib: int
    nvme_gb: int
    gpu_peak_bf16_tflops: float = 0.0


_L40S = ("NVIDIA L40S", 48.0)
_H100 = ("NVIDIA H100", 80.0)
_H200 = ("NVIDIA H200", 141.0)
#: Dense BF16 tensor-core peak per GPU model, TFLOP/s (see ``InstanceType.gpu_peak_bf16_tflops``).
GPU_PEAK_BF16_TFLOPS = {"NVIDIA L40S": 362.05, "NVIDIA H100": 989.4, "NVIDIA H200": 989.4}

INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: replace(t, gpu_peak_bf16_tflops=GPU_PEAK_BF16_TFLOPS[t.gpu_model])
    for t in (
        InstanceType("ml.g6e.xlarge", *_L40S[:1], 1, _L40S[1], 4, 32, 250),
        InstanceType("ml.g6e.2xlarge", *_L40S[:1], 1, _L40S[1], 8, 64, 450),
        InstanceType("ml.g6e.4xlarge", *_L40S[:1], 1, _L40S[1], 16, 128, 600),
        InstanceType("ml.g6e.8xlarge", *_L40S[:1], 1, _L40S[1], 32, 256, 900),
        InstanceType("ml.g6e.16xlarge", *_L40S[:1], 1, _L40S[1], 64, 512, 1900),
        InstanceType("ml.g6e.12xlarge", *_L40S[:1], 4, _L40S[1], 48, 384, 3800),
        InstanceType("ml.g6e.24xlarge", *_L40S[:1], 4, _L40S[1], 96, 768, 3800),
        InstanceType("ml.g6e.48xlarge", *_L40S[:1], 8, _L40S[1], 192, 1536, 7600),
        InstanceType("ml.p5.48xlarge", *_H100[:1], 8, _H100[1], 192, 2048, 30720),
        InstanceType("ml.p5e.48xlarge", *_H200[:1], 8, _H200[1], 192, 2048, 30720),
        InstanceType("ml.p5en.48xlarge", *_H200[:1], 8, _H200[1], 192, 2048, 30720),
    )
}


def get_instance_type(name: str) -> InstanceType:
    """Return the hardware facts for ``name``.

    Raises:
        KeyError: ``name`` is not in :data:`INSTANCE_TYPES`; the message lists the known types.
    """
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise KeyError(
            f"unknown instance type {name!r}; known: {', '.join(sorted(INSTANCE_TYPES))}"
        ) from None
