"""Facts about the SageMaker HyperPod instance types this project plans and validates for.

One table, shared by config validation (does a replica's GPU request fit its instance type?)
and by the capacity planner (``capacity.planner``). Units are spelled out in every field name:
``gpu_memory_gib`` is GiB of HBM per GPU, ``host_memory_gib`` GiB of DRAM per instance,
``nvme_gb`` decimal GB of local instance storage per instance (AWS quotes NVMe in GB).

Sources: Amazon EC2 accelerated-computing instance specifications for G6e
(https://aws.amazon.com/ec2/instance-types/g6e/) and P5
(https://aws.amazon.com/ec2/instance-types/p5/), as listed in 2026; GPU memory as marketed by
NVIDIA (L40S 48 GB, H100 80 GB, H200 141 GB). What CUDA really exposes of it (an L40S about
44.5 GiB) is in :mod:`capacity.gpu_memory`, sourced; the planner's fit rule uses that, not the
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
            larger "with sparsity" figures are twice these). Used by ``capacity.planner``
            to scale the prefill rate calibrated on the reference run (an L40S) to other GPUs.
        enis: Network interfaces of the default network card (EC2 ``DefaultMaxENIs``).
        ipv4_per_eni: IPv4 addresses per interface (EC2 ``Ipv4AddressesPerInterface``). Both from
            ``nodeadm/internal/kubelet/instance-info.jsonl`` of awslabs/amazon-eks-ami at tag
            v20260724 (docs/sources.md §14); they give :attr:`max_pods`.
    """

    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    host_memory_gib: int
    nvme_gb: int
    gpu_peak_bf16_tflops: float = 0.0
    enis: int = 0
    ipv4_per_eni: int = 0

    @property
    def max_pods(self) -> int:
        """Pods the kubelet admits with the VPC CNI's secondary IPs: ``enis x (ipv4_per_eni - 1) + 2``
        (nodeadm's ``calculateStandardMaxPods``, amazon-eks-ami v20260724; docs/sources.md §14)."""
        return self.enis * (self.ipv4_per_eni - 1) + 2

    def cpus(self, threads_per_core: int) -> int:
        """CPUs the node's kubelet sees: ``vcpus`` counts 2 threads per core (EC2's default
        ``ThreadsPerCore`` for these types), and a HyperPod instance group's ``ThreadsPerCore`` 1
        turns multithreading off, leaving one CPU per core (docs/sources.md §14)."""
        return self.vcpus // DEFAULT_THREADS_PER_CORE * threads_per_core


_L40S = ("NVIDIA L40S", 48.0)
_H100 = ("NVIDIA H100", 80.0)
_H200 = ("NVIDIA H200", 141.0)
#: Dense BF16 tensor-core peak per GPU model, TFLOP/s (see ``InstanceType.gpu_peak_bf16_tflops``).
GPU_PEAK_BF16_TFLOPS = {"NVIDIA L40S": 362.05, "NVIDIA H100": 989.4, "NVIDIA H200": 989.4}

#: EC2's default threads per core of every type here (EC2 API ``CpuOptions``: "The default value is 2").
DEFAULT_THREADS_PER_CORE = 2
#: (DefaultMaxENIs, Ipv4AddressesPerInterface) per type: amazon-eks-ami v20260724,
#: ``nodeadm/internal/kubelet/instance-info.jsonl`` (docs/sources.md §14).
ENI_LIMITS: dict[str, tuple[int, int]] = {
    "ml.g6e.xlarge": (4, 15), "ml.g6e.2xlarge": (4, 15), "ml.g6e.4xlarge": (8, 30), "ml.g6e.8xlarge": (8, 30),
    "ml.g6e.16xlarge": (15, 50), "ml.g6e.12xlarge": (10, 30), "ml.g6e.24xlarge": (10, 50),
    "ml.g6e.48xlarge": (10, 50), "ml.p5.48xlarge": (2, 50), "ml.p5e.48xlarge": (2, 50),
    "ml.p5en.48xlarge": (4, 50),
}

INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: replace(t, gpu_peak_bf16_tflops=GPU_PEAK_BF16_TFLOPS[t.gpu_model], enis=ENI_LIMITS[t.name][0],
                    ipv4_per_eni=ENI_LIMITS[t.name][1])
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
