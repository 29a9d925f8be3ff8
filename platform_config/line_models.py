"""``config/business-lines/<name>.yaml``: one business line's endpoint (model, vLLM, cache, hot
prefixes, SLO), :class:`BusinessLineConfig` and the models it is made of.

Every model forbids unknown keys, so a misspelled field is an error rather than a silently
ignored setting. Field-level rules live on the fields; rules that span files (a business
line's instance type must be one of the platform's instance groups, ...) live in
:func:`platform_config.loader.load_project`.

Units are in the field names: ``*_gib`` is GiB (2^30 bytes), ``*_gb`` decimal GB where AWS
defines the unit that way (EBS ``VolumeSizeInGB`` is GiB in practice but named GB by the API;
we keep the API's name), ``*_mibps`` MiB/s.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from platform_config import vllm_args as vllm_flags
from platform_config import vllm_cli
from platform_config.fields import (
    AWS_REGION_PATTERN,
    GATEWAY_ROUTING,
    LMCACHE_IMAGE_REPOSITORY,
    LMCACHE_VERSION,
    BytesQuantity,
    CpuQuantity,
    DnsLabel,
    KnownInstanceType,
    PinnedImage,
    PinnedVersion,
    RoutingStrategy,
    StrictModel,
    lmcache_version_of_image,
    quantity_bytes,
)
from platform_config.instances import INSTANCE_TYPES
from platform_config.problems import FieldError


class S3ModelSource(StrictModel):
    """Model weights in S3 (mounted by the Mountpoint for S3 CSI driver)."""

    type: Literal["s3"]
    bucket: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]
    region: Annotated[str, StringConstraints(pattern=AWS_REGION_PATTERN)]
    #: Prefix of the model inside the bucket.
    location: Annotated[str, StringConstraints(min_length=1)]
    prefetch: bool = False


class HuggingFaceModelSource(StrictModel):
    """Model weights downloaded from the Hugging Face Hub at pod start."""

    type: Literal["huggingface"]
    model_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")]
    #: Commit to pin; recommended so every replica loads identical weights (cache keys match).
    commit_sha: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")] | None = None
    #: Kubernetes Secret holding an HF token (under key `token`) for gated models. The line's
    #: stack creates the namespace: deploy it, then create the Secret from stdin, so the token is
    #: in no command line or shell history: `read -rs HF_TOKEN; printf %s "$HF_TOKEN" | kubectl -n
    #: <namespace> create secret generic <name> --from-file=token=/dev/stdin; unset HF_TOKEN`
    #: (docs/deploy.md), before the endpoint's pods can load the model.
    token_secret_name: DnsLabel | None = None


class FsxModelSource(StrictModel):
    """Model weights on FSx for Lustre."""

    type: Literal["fsx"]
    file_system_id: Annotated[str, StringConstraints(pattern=r"^fs-[0-9a-f]{8,17}$")]
    dns_name: Annotated[str, StringConstraints(min_length=1)]
    mount_name: Annotated[str, StringConstraints(min_length=1)]
    location: Annotated[str, StringConstraints(min_length=1)]


ModelSource = Annotated[
    Union[S3ModelSource, HuggingFaceModelSource, FsxModelSource], Field(discriminator="type")
]


class ModelConfig(StrictModel):
    """The model a business line serves.

    ``name`` is the ``modelName`` of the InferenceEndpointConfig. LMCache's chunk file names
    carry the model *path* inside the pod (``vllm.model_mount_path``), not this name, so the
    platform puts every line's chunks in a directory derived from the model identity (name,
    source and revision), dtype, TP size, chunk size and the rest of what makes KV incompatible
    (:func:`k8s.lmcache.l2_cache_dir`): any such change starts an empty directory.
    """

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", max_length=63)]
    source: ModelSource
    dtype: Literal["bfloat16", "float16", "fp8"] = "bfloat16"


class VllmConfig(StrictModel):
    """The vLLM worker container (LMCache-enabled image)."""

    #: LMCache-enabled vLLM image, pinned by tag or digest.
    image: PinnedImage
    #: vLLM arguments (model path first). With kvCacheSpec on, the operator adds LMCache's KV
    #: connector itself (the operator's own L1/L2 sample passes only model and length flags), and
    #: the platform completes it with `kv_load_failure_policy: recompute`: `--kv-transfer-config`
    #: is refused here (docs/l2-cache.md), as is `--no-enable-prefix-caching` (L0 is always on).
    #: The model path must be `model_mount_path` or under it; `--max-model-len` is read as vLLM
    #: reads it (8192, 8k, 8K, auto) and must fit the model's context. Every other word is held
    #: to vLLM 0.29's own parser (its options, values, types and choices: `vllm_serve_flags.json`),
    #: so what vLLM would refuse at pod start is refused at synthesis.
    args: tuple[str, ...] = ()
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    #: Path the operator mounts model weights at (``worker.modelVolumeMount.mountPath``).
    model_mount_path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/-]+$")] = "/opt/ml/model"
    #: LMCache release inside `image`; leave null for `lmcache/vllm-openai:vX.Y.Z` images (the
    #: tag names it), set it for any other image. Must be the release the platform is checked
    #: against (`LMCACHE_VERSION`, 0.5.5): the env allow-list, the unsafe-default table and the
    #: real-library tests (`make test-lmcache`) are all of that version.
    lmcache_version: PinnedVersion | None = None

    @field_validator("args")
    @classmethod
    def _no_owned_flags(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        owned = vllm_flags.owned_flags_in(args)
        if owned:
            refused = {**vllm_flags.OWNED_VLLM_FLAGS, **vllm_flags.REFUSED_VLLM_FLAGS}
            reasons = "; ".join(f"{flag}: {why}" for flag, why in refused.items()
                                if any(a.replace("_", "-").startswith(flag) for a in owned))
            raise ValueError(f"vllm.args sets {', '.join(repr(a) for a in owned)}, which the platform owns ({reasons}); "
                             f"allowed: any vLLM flag but {', '.join(refused)}; remove it")
        algo = vllm_flags.prefix_caching_hash_algo(args)
        if algo in vllm_flags.REFUSED_PREFIX_CACHING_HASHES:
            raise ValueError(f"vllm.args sets {vllm_flags.PREFIX_CACHING_HASH_FLAG} {algo}, a hash that is not collision "
                             "resistant, started from a NONE_HASH that the line's PYTHONHASHSEED makes predictable: crafted "
                             "prompts could collide with another user's in vLLM's prefix cache (GHSA-rm76-4mrf-v9r8; "
                             "docs/security.md, \"Chunk keys\"); allowed: sha256 (vLLM's default) or sha256_cbor")
        vllm_flags.max_model_len(args)  # ValueError: a length vLLM would refuse at pod start
        problems = vllm_cli.serve_args_problems(args, vllm_cli.CHECKED_ELSEWHERE)
        if problems:
            version = vllm_cli.options()[0]
            raise ValueError(f"vLLM {version} would refuse these arguments at pod start: {'; '.join(problems)}; allowed: "
                             f"the options of vLLM {version}'s server (platform_config/vllm_serve_flags.json, as "
                             "`vllm serve --help` lists them), each followed by its values, and one model path")
        return args

    @model_validator(mode="after")
    def _serves_the_mounted_model(self) -> "VllmConfig":
        """vLLM must serve the weights the operator mounts: without a model path ``vllm serve`` takes
        its built-in default from a hub the pod cannot reach; another path holds no weights."""
        path = vllm_flags.model_path(self.args)
        mount = self.model_mount_path.rstrip("/")
        if path is None or not (path.rstrip("/") == mount or path.startswith(mount + "/")):
            found = "no model path" if path is None else f"model path {path!r}"
            raise FieldError("args", f"vllm.args has {found}, but the operator mounts the model at model_mount_path "
                             f"{self.model_mount_path!r}; allowed: {self.model_mount_path!r} (or a path under it) as the "
                             "first argument or --model")
        return self

    @model_validator(mode="after")
    def _one_lmcache_version(self) -> "VllmConfig":
        from_tag = lmcache_version_of_image(self.image)
        if self.lmcache_version is not None and from_tag is not None and self.lmcache_version != from_tag:
            raise FieldError("lmcache_version", 
                f"lmcache_version {self.lmcache_version!r} contradicts image {self.image!r}, whose tag names "
                f"LMCache {from_tag}; allowed: no lmcache_version, or the image's")
        version = self.lmcache_version or from_tag
        if version is None:
            raise FieldError(
                "lmcache_version", f"cannot tell the LMCache release inside image {self.image!r} (not a "
                f"{LMCACHE_IMAGE_REPOSITORY}:vX.Y.Z tag); set vllm.lmcache_version; allowed: {LMCACHE_VERSION}")
        if version != LMCACHE_VERSION:
            raise FieldError(
                "image", f"image {self.image!r} carries LMCache {version}, but the platform's env allow-list, unsafe-default "
                f"table and real-library tests are of LMCache {LMCACHE_VERSION}; allowed: "
                f"{LMCACHE_IMAGE_REPOSITORY}:v{LMCACHE_VERSION} (or an image with lmcache_version: "
                f"{LMCACHE_VERSION}); to move to another release see docs/l2-cache.md")
        return self

    @property
    def lmcache_release(self) -> str:
        """The LMCache release inside ``image`` (validated equal to :data:`LMCACHE_VERSION`)."""
        return self.lmcache_version or lmcache_version_of_image(self.image) or LMCACHE_VERSION


class ResourcesConfig(StrictModel):
    """CPU and memory per replica (GPUs come from ``gpus_per_replica``)."""

    #: CPU request per replica: cores (8, 0.5) or millicores (500m), no byte suffix.
    cpu: CpuQuantity = "6"
    #: Memory request per replica, a byte quantity of at least 1Gi (the L1 buffer lives in it).
    memory: BytesQuantity = "30Gi"


class CacheConfig(StrictModel):
    """Which KV-cache tiers the line uses. L0 (vLLM prefix cache) is always on."""

    l1_enabled: bool = True
    l2_enabled: bool = True
    #: Capacity of the line's L2 directory (its RWX PVC on the Curvine StorageClass), enforced by
    #: the line's L2 janitor (the watermarks are fractions of it). Free to change: the PVC requests
    #: a constant and carries this as an annotation (docs/l2-cache.md, "Pool sizing").
    l2_size: BytesQuantity = "500Gi"
    #: LMCache chunk size in tokens; 256 is LMCache's default and what the reference used.
    chunk_size_tokens: Annotated[int, Field(ge=16, le=4096)] = 256
    #: GiB of host memory LMCache's CPU tier (L1, `local_cpu`) may use per pod, split evenly
    #: across the pod's TP ranks (`LMCACHE_MAX_LOCAL_CPU_SIZE`, which LMCache reads in GiB);
    #: null = LMCache's default, 5 GB per rank. The buffer is pinned memory of the vLLM
    #: process, so it must stay below the pod's `resources.memory`; it is not HyperPod Tiered
    #: Storage, whose share belongs to the ai-toolkit daemon.
    l1_cpu_gib: Annotated[float, Field(gt=0)] | None = None
    #: How the operator runs LMCache (`lmcache.mode` of InferenceEndpointConfig from operator v3.7,
    #: aws/sagemaker-hyperpod-cli PR #464): `InProcess`, inside the vLLM process, the only mode the
    #: platform's L2 works in. `MultiProcess` (a co-located `lmcache server` sidecar) is refused: that
    #: server takes its L2 from its own `--l2-adapter` arguments, not from the `LMCACHE_*` env the L2
    #: mutation sets, so the line would run without Curvine (docs/l2-cache.md, "LMCache's
    #: MultiProcess mode"). Not rendered while the CRD bindings (operator v3.2) lack the field.
    lmcache_mode: Literal["InProcess"] = "InProcess"
    #: Generation of the line's chunk key, the secret every vLLM pod and the L2 janitor start LMCache's
    #: chunk names from (docs/security.md, "Chunk keys"): Secret `kvcache-l2-key-<generation>` in the
    #: line's namespace, created by the line's L2 janitor with 256 random bits on its first start, never
    #: changed, never in a template. Raise it to rotate the key: a new Secret, a new L2 directory (the
    #: janitor deletes the old one) and a cold cache; delete the old Secret by hand afterwards.
    chunk_key_generation: Annotated[int, Field(ge=1, le=999999, strict=True)] = 1

    @field_validator("lmcache_mode", mode="before")
    @classmethod
    def _l2_works_in_process_only(cls, mode: object) -> object:
        if mode == "MultiProcess":
            raise ValueError(
                "lmcache_mode MultiProcess runs LMCache as a sidecar server that takes its L2 from its own "
                "--l2-adapter arguments, not from the LMCACHE_* env the platform's L2 mutation sets, so the line "
                "would store nothing in Curvine (docs/l2-cache.md, \"LMCache's MultiProcess mode\"); allowed: InProcess")
        return mode

    @model_validator(mode="after")
    def _l1_size_needs_l1(self) -> "CacheConfig":
        if self.l1_cpu_gib is not None and not self.l1_enabled:
            raise FieldError("l1_cpu_gib", "l1_cpu_gib sizes the L1 tier, which is off; allowed: l1_enabled: true, or "
                                               "no l1_cpu_gib")
        return self


#: Tokens after the full chunks of a canary prompt (``cluster_agents.kv_canary.TAIL_TOKENS``, which runs
#: alone from a ConfigMap and so keeps its own copy; a test holds the two equal).
CANARY_TAIL_TOKENS = 16


class CanaryConfig(StrictModel):
    """The line's cross-pod hit canary (docs/observability.md): a small Deployment that every
    ``period_minutes`` sends a fresh prompt of ``prompt_chunks`` chunks to one replica, then to
    another, and exports how much of it the second served from L2. Only lines with L2 run it."""

    #: false: no canary (and no canary alert) for this line.
    enabled: bool = True
    #: Minutes between two runs. Each run sends exactly 2 completion requests of
    #: ``max_tokens`` 1 (one per replica), so the canary adds at most 2 requests per period.
    period_minutes: Annotated[int, Field(ge=1, le=60)] = 5
    #: Full LMCache chunks (``cache.chunk_size_tokens`` each) in the canary prompt, plus 16
    #: tokens; each run writes this many new chunks to L2, which the janitor ages out.
    prompt_chunks: Annotated[int, Field(ge=1, le=16)] = 4


#: Most UTF-8 bytes of declared prefix text per business line, all its prefixes together (128 KiB,
#: about 30,000 tokens of English). The text travels to the cluster in the line's L2 janitor ConfigMap,
#: inside the line's CloudFormation template, where JSON escapes it twice: a quote or backslash takes 4
#: bytes there, so 128 KiB stays below 512 KiB of the template's 1,000,000 bytes whatever the text
#: (control characters, which would take 7, are refused); the line's other manifests take about 110 KB.
MAX_HOT_PREFIX_BYTES = 128 * 1024
#: Declared prefixes per line (each a label value of the janitor's metrics and a warm-up request).
MAX_HOT_PREFIXES = 16
#: Path of a prefix file relative to the directory of the line's YAML file: letters, digits, ``._-``
#: and ``/`` for subdirectories; not absolute, and (checked beside the pattern) no ``.`` or ``..`` component.
HOT_PREFIX_FILE_PATTERN = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
#: Control characters refused in prefix text (tab, newline and carriage return are text).
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def hot_prefix_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a declared prefix's text (empty, or a control character), else None."""
    if not text.strip():
        return "is empty; allowed: the prefix's text (a system prompt, a RAG preamble, tool schemas)"
    bad = _CONTROL_CHARS.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        return (f"holds the control character U+{ord(bad.group()):04X} on line {line}; allowed: text whose only "
                "control characters are tab, newline and carriage return")
    return None


def _check_prefix_text(value: str | None) -> str | None:
    if value is not None:
        problem = hot_prefix_text_problem(value)
        if problem:
            raise ValueError(problem)
    return value


PrefixText = Annotated[str, AfterValidator(_check_prefix_text)]
def _check_prefix_file(value: str) -> str:
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError("must stay inside the directory of the line's file; allowed: a relative path without "
                         "'.' or '..' components, e.g. rag-assistant.system-prompt.md")
    return value


PrefixFile = Annotated[str, StringConstraints(pattern=HOT_PREFIX_FILE_PATTERN, max_length=255),
                       AfterValidator(_check_prefix_file)]


class HotPrefixMessage(StrictModel):
    """One chat message of a declared prefix, rendered by the model's chat template on a replica."""

    #: OpenAI chat role: `system` (a system prompt), `developer`, `user` or `assistant`.
    role: Literal["system", "developer", "user", "assistant"]
    #: The message's text, inline. Give `content` or `file`, not both.
    content: PrefixText | None = None
    #: A UTF-8 text file holding the message's text, relative to the directory of the line's YAML
    #: file (e.g. `rag-assistant.system-prompt.md` beside it); read when the config is loaded.
    file: PrefixFile | None = None

    @model_validator(mode="after")
    def _content_or_file(self) -> "HotPrefixMessage":
        if (self.content is None) == (self.file is None):
            raise FieldError("content", "give the message's text in content or name its file in file, not both "
                                        "and not neither; allowed: exactly one of content and file")
        return self

    @property
    def text(self) -> str:
        """The message's text (``content``, or the file's text once the loader has read it)."""
        if self.content is None:
            raise ValueError(f"prefix file {self.file!r} was not read (load the line with the config loader)")
        return self.content


class HotPrefix(StrictModel):
    """A shared leading prompt of the line: chat `messages` (what user requests start with), or raw
    `text` / a `file` of raw text (the start of /v1/completions prompts). Give exactly one of the three."""

    #: Name of the prefix: a DNS-1123 label, unique in the line (a label of the janitor's metrics).
    name: DnsLabel
    #: The leading chat messages every user request of this prefix starts with, in order (e.g. one
    #: `system` message). Rendered with the model's chat template, without the generation prompt.
    messages: Annotated[tuple[HotPrefixMessage, ...], Field(max_length=16)] = ()
    #: Raw prompt text, inline (tokenized as vLLM tokenizes a /v1/completions prompt, BOS included).
    text: PrefixText | None = None
    #: A UTF-8 file of raw prompt text, relative to the directory of the line's YAML file.
    file: PrefixFile | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "HotPrefix":
        given = [k for k, v in (("messages", self.messages), ("text", self.text), ("file", self.file)) if v]
        if len(given) != 1:
            raise FieldError("messages", f"a prefix takes exactly one of messages, text or file (got "
                                         f"{', '.join(given) or 'none'}); allowed: one of them")
        return self

    @property
    def kind(self) -> Literal["chat", "text"]:
        """``chat`` (messages, tokenized with the chat template) or ``text`` (a raw prompt)."""
        return "chat" if self.messages else "text"

    @property
    def raw_text(self) -> str:
        """The raw prompt of a ``text`` prefix (``text``, or the file's text once the loader has read it)."""
        if self.text is None:
            raise ValueError(f"prefix {self.name!r}: no raw text (a chat prefix, or its file was not read)")
        return self.text

    def texts(self) -> list[str]:
        """Every text of the prefix, in order (message texts, or the raw text)."""
        return [m.text for m in self.messages] if self.messages else [self.raw_text]


class HotPrefixesConfig(StrictModel):
    """The line's shared prefixes, kept in L2 (docs/l2-cache.md, "Hot prefixes"): the line's L2 janitor
    sends each once through a replica before traffic needs it (after a new replica turns Ready and
    every `warm_period_minutes`), never evicts its chunks, and restores those that went missing."""

    #: false: declared prefixes are validated but not warmed or pinned.
    enabled: bool = True
    #: Minutes between two scheduled warm-ups (each sends every prefix once; a prefix already in
    #: L2 is a full hit). A new Ready replica triggers one at once.
    warm_period_minutes: Annotated[int, Field(ge=5, le=1440)] = 60
    #: Largest share of `cache.l2_size` the prefixes may pin, checked at synthesis against a bound of
    #: their KV bytes (docs/l2-cache.md); must stay below `curvine.eviction.low_watermark`.
    max_l2_fraction: Annotated[float, Field(gt=0, le=0.5)] = 0.1
    #: The prefixes (at most 16; their text at most 128 KiB of UTF-8 together).
    prefixes: Annotated[tuple[HotPrefix, ...], Field(max_length=MAX_HOT_PREFIXES)] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> "HotPrefixesConfig":
        seen: set[str] = set()
        for i, prefix in enumerate(self.prefixes):
            if prefix.name in seen:
                raise FieldError(f"prefixes.{i}.name", f"prefix name {prefix.name!r} is used twice; allowed: a "
                                                       "name unique in the line")
            seen.add(prefix.name)
        return self

    @property
    def active(self) -> bool:
        """Whether prefixes are warmed and pinned: ``enabled`` and at least one prefix."""
        return self.enabled and bool(self.prefixes)


class SloConfig(StrictModel):
    """Service-level objectives of a line, drawn on its dashboard row and alerted on."""

    #: Time to first token, 90th percentile, in ms. The alert fires when the line's p90 over
    #: 5 minutes stays above it for 10 minutes. Default 2,000 ms: the reference deployment's cold
    #: TTFT was 774 ms at 2,500 tokens for a 7B model on L40S (docs/sources.md §1), so 2 s leaves
    #: room for queueing; set each line's own.
    ttft_p90_ms: Annotated[int, Field(ge=1, le=600000)] = 2000


#: Most replicas a line may have, fixed or autoscaled (``replicas``, ``autoscaling.max_replicas``).
MAX_REPLICAS = 100


class AutoscalingTriggers(StrictModel):
    """What the line scales on: three signals users feel, each a KEDA Prometheus trigger of the
    line's InferenceEndpointConfig (``autoScalingSpec.prometheusTriggerList``), read from the
    platform's Amazon Managed Prometheus workspace (docs/observability.md, "Autoscaling").

    The HorizontalPodAutoscaler KEDA makes takes the largest replica count any trigger asks for
    (Kubernetes HPA, "Algorithm details"), within ``min_replicas``..``max_replicas``. Set a trigger
    to null to drop it; at least one must stay. The defaults are this platform's starting points, not
    figures from a source: tune them on the line's dashboard row.
    """

    #: Requests waiting in vLLM's queue per replica (``vllm:num_requests_waiting``, summed over the line)
    #: that the line should hold at most: KEDA ``metricType: Average``, so the HPA asks for
    #: ceil(waiting / this) replicas. A request waits when vLLM cannot admit it (KV cache or
    #: ``--max-num-seqs`` full), and every waiting request adds whole prefills to its TTFT. Default 4.
    waiting_requests_per_replica: Annotated[float, Field(gt=0, le=1000)] | None = 4
    #: GPU KV-cache usage (0-1; ``vllm:kv_cache_usage_perc``, vLLM 0.29's name) averaged over the line's
    #: replicas to hold: KEDA ``metricType: Value``, so the HPA asks for ceil(replicas x usage / this).
    #: vLLM preempts running requests when usage reaches 1; 0.8 leaves room for the polling interval
    #: and a new replica's start (minutes of model loading). Default 0.8.
    kv_cache_usage: Annotated[float, Field(gt=0, le=1)] | None = 0.8
    #: TTFT p90 of the line's user requests (the SLO alert's own query, the canary's requests left
    #: out) to hold, as a share of ``slo.ttft_p90_ms``: KEDA ``metricType: Value``, so the HPA asks
    #: for ceil(replicas x p90 / (this x SLO)). Below 1, so the line grows before the SLO alert
    #: (p90 above the SLO for 10 minutes) fires. Default 0.8.
    ttft_p90_slo_fraction: Annotated[float, Field(gt=0, le=1)] | None = 0.8

    @model_validator(mode="after")
    def _at_least_one(self) -> "AutoscalingTriggers":
        if self.waiting_requests_per_replica is None and self.kv_cache_usage is None and \
                self.ttft_p90_slo_fraction is None:
            raise FieldError("waiting_requests_per_replica", "every trigger is null, so nothing would ever scale the "
                             "line; allowed: at least one of waiting_requests_per_replica, kv_cache_usage, "
                             "ttft_p90_slo_fraction (or no autoscaling section: a fixed replicas)")
        return self


class AutoscalingConfig(StrictModel):
    """Autoscaling of a line between ``min_replicas`` and ``max_replicas`` (the operator's
    ``autoScalingSpec``: KEDA, installed by the inference add-on with its own IRSA role).

    How ``replicas`` relates: with this section, ``replicas`` is only the count the endpoint starts
    with (``spec.replicas``, which the operator's CRD describes as the "initial pod count", with
    ``autoScalingSpec.minReplicaCount`` "the steady-state floor under autoscaling"); left out, it is
    ``min_replicas``; given, it must lie in ``min_replicas``..``max_replicas``. Without this section
    ``replicas`` is the fixed count, as before.

    The node check (``make synth``) and the planner place ``max_replicas`` replicas: a line may only
    grow to what its instance groups' nodes hold next to every other line at its own maximum.
    """

    #: Fewest replicas, at least 1: never scaled to zero (a cold start loads the whole model, and the L2
    #: janitor's warmer and the canary need a replica to talk to). With 1 the cross-pod canary measures
    #: nothing while the line is at 1 (its single-replica mode: no ratio, no alert), and the disruption
    #: budget (maxUnavailable 1) lets a drain take the one replica.
    min_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
    #: Most replicas; every one of them must fit the nodes (checked at synthesis, with the other
    #: lines at their own maximum; ``scripts/plan.py --business-line`` shows the bound and the cost).
    max_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
    triggers: AutoscalingTriggers = AutoscalingTriggers()
    #: Seconds between two evaluations of the triggers (``pollingInterval``; the CRD's default 30).
    polling_interval_seconds: Annotated[int, Field(ge=5, le=600)] = 30
    #: Seconds the HPA waits, after the triggers ask for fewer replicas, before removing one
    #: (``scaleDownStabilizationTime``; the CRD's default 300): a replica takes minutes to load the
    #: model, so a short dip must not remove it.
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    #: Seconds the HPA waits before adding replicas (``scaleUpStabilizationTime``; the CRD's default 0).
    scale_up_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 0

    @model_validator(mode="after")
    def _min_below_max(self) -> "AutoscalingConfig":
        if self.min_replicas > self.max_replicas:
            raise FieldError("min_replicas", f"min_replicas {self.min_replicas} is above max_replicas "
                             f"{self.max_replicas}; allowed: min_replicas 1..{self.max_replicas} (or a larger max_replicas)")
        return self


#: An ``https://`` URL (the gateway's JWT issuer and JWKS endpoint: AWS's gateway guide, ``spec.auth``).
HTTPS_URL_PATTERN = r"^https://[^\s/?#]+[^\s]*$"
HttpsUrl = Annotated[str, StringConstraints(pattern=HTTPS_URL_PATTERN)]


class GatewayJwtClaim(StrictModel):
    """One ``requiredClaims`` entry of the gateway's JWT provider (AWS's gateway guide, ``spec.auth``,
    docs/sources.md §31): a token is admitted only if its claim ``name`` holds one of ``values``."""

    #: The claim's name in the token (e.g. ``groups``, ``scope``); the guide gives no length limit.
    name: Annotated[str, StringConstraints(min_length=1)]
    #: ``String`` (a single value) or ``StringArray`` (a list in the token), the guide's ``valueType``.
    value_type: Literal["String", "StringArray"] = "String"
    #: Accepted values: 1-128 entries of 1-1024 characters each (the guide's limits).
    values: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]],
                      Field(min_length=1, max_length=128)]


class GatewayJwtProvider(StrictModel):
    """``spec.auth.jwt.provider`` of the line's ``InferenceGatewayConfig`` (AWS's gateway guide, "spec fields",
    ``auth``; docs/sources.md §31). The gateway then refuses a request without a valid bearer token signed
    by a key of ``remote_jwks_uri`` and issued by ``issuer``; load balancer health checks stay
    unauthenticated. At least one of ``audiences`` or ``required_claims`` is required (the guide's rule)."""

    #: Unique name of the provider (the guide's ``name``, required; it gives no length limit).
    name: Annotated[str, StringConstraints(min_length=1)]
    #: OIDC issuer URL, ``https://...``; the token's ``iss`` claim must equal it (``issuer``, required).
    issuer: HttpsUrl
    #: HTTPS JWKS endpoint publishing the issuer's signing keys (``remoteJWKS.uri``, required).
    remote_jwks_uri: HttpsUrl
    #: Accepted ``aud`` claim values, at most 8 (``audiences``); default: none.
    audiences: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(max_length=8)] = []
    #: Claim-based authorization, at most 16 entries (``requiredClaims``); default: none.
    required_claims: Annotated[list[GatewayJwtClaim], Field(max_length=16)] = []

    @model_validator(mode="after")
    def _audience_or_claims(self) -> "GatewayJwtProvider":
        if not self.audiences and not self.required_claims:
            raise ValueError("the gateway's JWT provider needs audiences or required_claims (AWS's "
                             "gateway guide: at least one of them); allowed: audiences: [<aud>, ...] (at most 8) "
                             "and/or required_claims: [{name, value_type, values}] (at most 16)")
        return self

    def manifest(self) -> dict[str, object]:
        """The provider as the CRD spells it (camelCase; empty lists left out)."""
        provider: dict[str, object] = {"name": self.name, "issuer": self.issuer,
                                       "remoteJWKS": {"uri": self.remote_jwks_uri}}
        if self.audiences:
            provider["audiences"] = list(self.audiences)
        if self.required_claims:
            provider["requiredClaims"] = [{"name": c.name, "valueType": c.value_type, "values": list(c.values)}
                                          for c in self.required_claims]
        return provider


class GatewayWeights(StrictModel):
    """Scoring weights of the line's scheduler entry in its ``InferenceGatewayConfig`` (``weights`` of
    ``SchedulerSpec``, AWS's gateway guide, docs/sources.md §31): non-negative integers, relative to each
    other. A weight left unset (null) is not written; the guide lists a default per field (``queue`` 2,
    ``kv_cache`` 2, ``prefix`` 3; the others none), read here as applying to each field left out (not
    verified: set all three to be sure of them)."""

    #: Pending request queue depth (``queue``; gateway default 2).
    queue: Annotated[int, Field(ge=0)] | None = None
    #: KV cache utilization (``kvCache``; gateway default 2).
    kv_cache: Annotated[int, Field(ge=0)] | None = None
    #: Prefix-cache affinity (``prefix``; gateway default 3). 0 turns prefix scoring off.
    prefix: Annotated[int, Field(ge=0)] | None = None
    #: Least-recently-used scoring (``lru``); valid only for the ``llm-d`` scheduler, so it is added
    #: only to an entry whose ``scheduler`` is ``llm-d`` (or unset: ``llm-d`` is the default).
    lru: Annotated[int, Field(ge=0)] | None = None
    #: LoRA adapter affinity (``loraAffinity``).
    lora_affinity: Annotated[int, Field(ge=0)] | None = None
    #: Running requests on a pod (``runningRequests``).
    running_requests: Annotated[int, Field(ge=0)] | None = None
    #: Predicted request latency (``predictedLatency``).
    predicted_latency: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _some_weight(self) -> "GatewayWeights":
        if not self.manifest():
            raise ValueError("gateway.weights sets no weight; allowed: one or more of queue, kv_cache, prefix, "
                             "lru, lora_affinity, running_requests, predicted_latency (non-negative integers), or "
                             "no weights section")
        return self

    def manifest(self) -> dict[str, int]:
        """The weights as the CRD spells them (camelCase), unset ones left out."""
        crd = {"queue": "queue", "kv_cache": "kvCache", "prefix": "prefix", "lru": "lru",
               "lora_affinity": "loraAffinity", "running_requests": "runningRequests",
               "predicted_latency": "predictedLatency"}
        return {crd[f]: getattr(self, f) for f in crd if getattr(self, f) is not None}


class LineGatewayConfig(StrictModel):
    """What the platform adds to the ``InferenceGatewayConfig`` the operator creates for a gateway line
    (``routing_strategy: gateway``; docs/routing.md). The operator owns that object and its scheduler
    entry, so the platform renders neither: a Kyverno ``Policy`` in the line's namespace adds these at
    admission, each time the object is created or updated (k8s/gateway_policy.py)."""

    #: Request authentication of the line's gateway (``spec.auth.jwt.provider``); null (default): none,
    #: and the gateway accepts any request that reaches it (AWS strongly recommends setting it).
    #: Set, the platform owns ``spec.auth``: it is rewritten to this on every update of the object.
    jwt: GatewayJwtProvider | None = None
    #: Scorer weights added to the line's scheduler entry where it has neither ``weights`` nor
    #: ``configMapRef`` (the two are mutually exclusive); null (default): the gateway's defaults.
    #: Weights already on the entry (e.g. set with kubectl edit) are kept.
    weights: GatewayWeights | None = None


class BusinessLineConfig(StrictModel):
    """``config/business-lines/<name>.yaml``: one team's endpoint; ``name`` is the file stem."""

    #: Defaults to the file name; must equal it.
    name: DnsLabel
    #: Kubernetes namespace of the line's endpoint and PVC; unique per line.
    namespace: DnsLabel
    model: ModelConfig
    #: Must be the type of one of the platform's HyperPod instance groups.
    instance_type: KnownInstanceType
    #: Replicas of the endpoint. Without ``autoscaling``: the fixed count. With it: the count the
    #: endpoint starts with (default ``autoscaling.min_replicas``; must lie in min..max).
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 2
    #: Optional: scale between ``min_replicas`` and ``max_replicas`` on waiting requests, KV-cache
    #: usage and TTFT p90 (docs/observability.md, "Autoscaling"); null: a fixed ``replicas``. Needs
    #: ``observability.enabled`` in platform.yaml (KEDA reads the metrics from its Prometheus workspace).
    autoscaling: AutoscalingConfig | None = None
    #: GPUs per replica = tensor-parallel size; must fit the instance type.
    gpus_per_replica: Annotated[int, Field(ge=1, le=8)] = 1
    #: Router strategy (docs/routing.md): roundrobin when every request shares a prefix (prefixaware would
    #: send them all to one replica), for per-document reuse with the L2 and for short prompts; session for
    #: per-session reuse; gateway: the HyperPod Inference Gateway routes the line instead of the operator's
    #: router (prefix affinity with a load bound; needs inference_operator.gateway.enabled in platform.yaml).
    #: scripts/overlap.py advises it from a request log. Fixed after creation.
    routing_strategy: RoutingStrategy = "prefixaware"
    #: With ``routing_strategy: gateway`` only: request authentication and scorer weights of the line's
    #: gateway (docs/routing.md). Default: none of either.
    gateway: LineGatewayConfig = LineGatewayConfig()
    cache: CacheConfig = CacheConfig()
    vllm: VllmConfig
    resources: ResourcesConfig = ResourcesConfig()
    slo: SloConfig = SloConfig()
    canary: CanaryConfig = CanaryConfig()
    #: Shared leading prompts kept in L2: warmed before traffic, never evicted, restored after loss.
    hot_prefixes: HotPrefixesConfig = HotPrefixesConfig()
    #: PYTHONHASHSEED shared by every pod of the line. vLLM derives from it the initial prefix
    #: hash (`NONE_HASH`, random per process when unset) from which LMCache chains its chunk
    #: keys, so pods with different or unset seeds never hit each other's chunks. LMCache alone
    #: hashes tuples of integers, which the seed does not salt (docs/sources.md §8).
    python_hash_seed: Annotated[int, Field(ge=0, le=4294967295)] = 0
    metrics_enabled: bool = True
    invocation_endpoint: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/-]+$")] = "v1/chat/completions"
    #: false: the CI pipeline (.github/workflows/platform.yml) does not deploy this line, e.g. the
    #: examples in a fork; it is still validated, synthesized and tested, and is not an orphan.
    #: A hand-run `cdk deploy --all` deploys every line: deploy by hand with --exclusively.
    deploy: bool = True

    @model_validator(mode="after")
    def _gateway_settings_need_the_gateway(self) -> "BusinessLineConfig":
        if self.routing_strategy != GATEWAY_ROUTING and self.gateway != LineGatewayConfig():
            raise FieldError("gateway", f"gateway settings apply only to a line routed by the HyperPod Inference "
                             f"Gateway, and routing_strategy is {self.routing_strategy!r}; allowed: routing_strategy: "
                             f"gateway, or no gateway section")
        return self

    @model_validator(mode="before")
    @classmethod
    def _replicas_start_at_min(cls, data: object) -> object:
        """An autoscaling line without ``replicas`` starts at ``autoscaling.min_replicas`` (the class doc)."""
        if isinstance(data, dict) and "replicas" not in data and isinstance(data.get("autoscaling"), dict):
            low = data["autoscaling"].get("min_replicas")
            if isinstance(low, int) and not isinstance(low, bool) and 1 <= low <= MAX_REPLICAS:
                return {**data, "replicas": low}
        return data

    @model_validator(mode="after")
    def _replicas_within_bounds(self) -> "BusinessLineConfig":
        scaling = self.autoscaling
        if scaling is not None and not scaling.min_replicas <= self.replicas <= scaling.max_replicas:
            raise FieldError("replicas", f"replicas {self.replicas} is the count an autoscaling line starts with, "
                             f"outside autoscaling.min_replicas {scaling.min_replicas}..max_replicas "
                             f"{scaling.max_replicas}; allowed: {scaling.min_replicas}..{scaling.max_replicas}, or no "
                             "replicas (it starts at min_replicas)")
        return self

    @model_validator(mode="after")
    def _autoscaling_reads_vllm_metrics(self) -> "BusinessLineConfig":
        if self.autoscaling is not None and not self.metrics_enabled:
            raise FieldError("metrics_enabled", "metrics_enabled false leaves the autoscaling triggers without the "
                             "line's vLLM metrics; allowed: metrics_enabled true, or no autoscaling")
        return self

    @model_validator(mode="after")
    def _gpus_fit(self) -> "BusinessLineConfig":
        gpus = INSTANCE_TYPES[self.instance_type].gpus
        if self.gpus_per_replica > gpus:
            raise FieldError("gpus_per_replica", 
                f"gpus_per_replica {self.gpus_per_replica} does not fit {self.instance_type} "
                f"({gpus} GPU(s)); allowed: 1..{gpus}"
            )
        return self

    @field_validator("vllm")
    @classmethod
    def _parallel_sizes_use_every_gpu(cls, vllm: VllmConfig, info: ValidationInfo) -> VllmConfig:
        """vLLM uses tensor x pipeline x data parallel size GPUs (each 1 unless set in ``vllm.args``),
        whatever the pod was given: fewer leave GPUs idle, more fail at start. So the flags are
        required to say what ``gpus_per_replica`` says. Refused rather than injected: ``vllm.args``
        is the command the operator runs and part of the L2 directory digest, so it stays exactly
        what the config says (``-tp N``, ``--tensor-parallel-size=N`` and the pipeline/data forms
        are read by :mod:`platform_config.vllm_args`, the parser the digest uses)."""
        gpus = info.data.get("gpus_per_replica")
        if gpus is None:  # gpus_per_replica is itself invalid: reported on its own
            return vllm
        try:
            sizes = vllm_flags.parallel_sizes(vllm.args)
        except ValueError as exc:
            raise FieldError("args", str(exc)) from None
        used = math.prod(sizes.values())
        if used == gpus:
            return vllm
        if not sizes:
            raise FieldError(
                "args", f"vllm.args sets no {vllm_flags.TENSOR_PARALLEL_FLAG}, so vLLM runs each replica on 1 GPU and "
                f"leaves {gpus - 1} of its gpus_per_replica {gpus} idle; allowed: add "
                f'"{vllm_flags.TENSOR_PARALLEL_FLAG}", "{gpus}" to vllm.args (or set gpus_per_replica 1)')
        product = " x ".join(f"{flag} {sizes.get(flag, 1)}" for flag in vllm_flags.PARALLEL_FLAGS
                             if flag in sizes or flag == vllm_flags.TENSOR_PARALLEL_FLAG)
        flags_fix = ("no parallel-size flag in vllm.args" if gpus == 1 else
                     f"vllm.args whose tensor x pipeline x data parallel sizes multiply to {gpus} "
                     f'(e.g. "{vllm_flags.TENSOR_PARALLEL_FLAG}", "{gpus}")')
        raise FieldError(
            "args", f"vllm.args asks vLLM for {product} = {used} GPU(s) per replica, but gpus_per_replica is {gpus}; "
            f"allowed: gpus_per_replica {used}, or {flags_fix}")

    @model_validator(mode="after")
    def _l1_fits_pod_memory(self) -> "BusinessLineConfig":
        l1 = self.cache.l1_cpu_gib
        memory_gib = quantity_bytes(self.resources.memory) / 2**30
        if l1 is not None and l1 >= memory_gib:
            raise FieldError("cache.l1_cpu_gib", 
                f"cache.l1_cpu_gib {l1:g} GiB must be below resources.memory {self.resources.memory} "
                f"({memory_gib:g} GiB): the L1 buffer lives in the pod's memory; allowed: a smaller "
                "cache.l1_cpu_gib or a larger resources.memory"
            )
        return self

    @model_validator(mode="after")
    def _canary_prompt_fits_the_model_length(self) -> "BusinessLineConfig":
        """The canary's prompt (and its one generated token) must fit ``--max-model-len`` when
        ``vllm.args`` sets it, or vLLM refuses every canary request."""
        if not self.runs_canary:
            return self
        length = vllm_flags.max_model_len(self.vllm.args)
        if length is None:  # not set: the model's own limit
            return self
        value = str(length)
        chunk = self.cache.chunk_size_tokens
        needed = self.canary.prompt_chunks * chunk + CANARY_TAIL_TOKENS + 1
        if needed > length:
            raise ValueError(
                f"canary.prompt_chunks {self.canary.prompt_chunks} x cache.chunk_size_tokens {chunk} + "
                f"{CANARY_TAIL_TOKENS + 1} = {needed} tokens exceed vllm.args --max-model-len {value}; allowed: "
                f"canary.prompt_chunks 1..{(int(value) - CANARY_TAIL_TOKENS - 1) // chunk} (or canary.enabled: false)")
        return self

    @property
    def min_replica_count(self) -> int:
        """Fewest replicas the line runs: ``autoscaling.min_replicas``, else ``replicas``."""
        return self.autoscaling.min_replicas if self.autoscaling is not None else self.replicas

    @property
    def max_replica_count(self) -> int:
        """Most replicas the line runs (what the node check places): ``autoscaling.max_replicas``, else ``replicas``."""
        return self.autoscaling.max_replicas if self.autoscaling is not None else self.replicas

    @property
    def runs_canary(self) -> bool:
        """Whether the line runs the cross-pod hit canary: L2 on and ``canary.enabled`` (L2 on
        already requires ``curvine.enabled``, checked by the loader)."""
        return self.cache.l2_enabled and self.canary.enabled

    @property
    def tensor_parallel_size(self) -> int:
        """TP degree: ``--tensor-parallel-size`` of ``vllm.args`` (1 when unset). Equals
        ``gpus_per_replica`` unless pipeline or data parallelism share the replica's GPUs
        (validated: their product is ``gpus_per_replica``)."""
        return vllm_flags.parallel_sizes(self.vllm.args).get(vllm_flags.TENSOR_PARALLEL_FLAG, 1)
