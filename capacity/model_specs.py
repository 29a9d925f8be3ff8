"""Architecture facts of the models the planner knows, or read from a Hugging Face ``config.json``.

Every figure in :data:`MODELS` is copied from the model's ``config.json`` on the Hugging Face
Hub (the URL is in ``source``); ``params`` is the exact parameter count of the published
safetensors weights, which :func:`count_params` reproduces from the same config fields (a test
checks that it does, so the formula and the table keep each other honest).

Only dense decoder-only transformers of the Llama/Qwen2 family are modelled (grouped-query
attention, SwiGLU MLP with three projections, RMSNorm). Mixture-of-experts configs are refused
with a clear error rather than mis-counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: Bytes per element of the dtypes a business line may declare (``model.dtype``).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one dense decoder-only model.

    Attributes:
        name: Canonical name, e.g. ``Qwen2-7B``.
        layers: ``num_hidden_layers``.
        hidden_size: ``hidden_size`` (model width), elements.
        attention_heads: ``num_attention_heads`` (query heads).
        kv_heads: ``num_key_value_heads`` (grouped-query attention; equals the query heads
            for plain multi-head attention).
        head_dim: elements per head (``head_dim`` if the config has it, else
            ``hidden_size / num_attention_heads``).
        intermediate_size: MLP width, elements.
        vocab_size: tokenizer vocabulary (embedding rows).
        params: total parameter count (embeddings and LM head included).
        tie_word_embeddings: LM head shares the embedding matrix.
        qkv_bias: Q/K/V projections carry a bias (Qwen2 does, Llama does not).
        max_position_embeddings: longest context the model was configured for, tokens.
        source: where the figures come from (a URL or a file path).
    """

    name: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 0
    source: str = ""

    def weights_bytes(self, dtype: str) -> int:
        """Bytes of the weights stored in ``dtype`` (``bfloat16``, ``float16`` or ``fp8``)."""
        return self.params * dtype_bytes(dtype)

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """KV cache bytes per token for the whole model: 2 (K and V) x layers x KV heads x
        head_dim x bytes per element (docs/sources.md §5). Qwen2-7B in bf16: 57,344."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    @property
    def attention_width(self) -> int:
        """Query heads x head_dim: the width the attention score and value products run at."""
        return self.attention_heads * self.head_dim


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    Raises:
        ValueError: unknown dtype; the message lists the allowed ones.
    """
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}") from None


def count_params(*, layers: int, hidden_size: int, attention_heads: int, kv_heads: int, head_dim: int,
                 intermediate_size: int, vocab_size: int, tie_word_embeddings: bool, qkv_bias: bool) -> int:
    """Parameters of a Llama/Qwen2-style dense model, exactly as its safetensors hold them.

    Per layer: Q and O projections (hidden x heads*head_dim each), K and V projections
    (hidden x kv_heads*head_dim each), optional Q/K/V biases, three MLP matrices
    (hidden x intermediate) and two RMSNorm weight vectors; plus the embedding, the final norm
    and, unless tied, the LM head. Reproduces the published totals, e.g. Qwen2-7B
    7,615,616,512 and Llama-3.1-8B 8,030,261,248.
    """
    q = attention_heads * head_dim
    kv = kv_heads * head_dim
    attention = hidden_size * q * 2 + hidden_size * kv * 2 + ((q + 2 * kv) if qkv_bias else 0)
    mlp = 3 * hidden_size * intermediate_size
    per_layer = attention + mlp + 2 * hidden_size
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return embeddings + layers * per_layer + hidden_size


def _spec(name: str, repo: str, *, layers: int, hidden: int, heads: int, kv_heads: int, inter: int,
          vocab: int, qkv_bias: bool, max_pos: int, params: int) -> ModelSpec:
    return ModelSpec(
        name=name, layers=layers, hidden_size=hidden, attention_heads=heads, kv_heads=kv_heads,
        head_dim=hidden // heads, intermediate_size=inter, vocab_size=vocab, params=params,
        tie_word_embeddings=False, qkv_bias=qkv_bias, max_position_embeddings=max_pos,
        source=f"https://huggingface.co/{repo}/blob/main/config.json",
    )


#: The public models the planner knows, by canonical name. Sources: each model's config.json
#: (URL in ``source``); ``params`` from the model card / safetensors index of the same repo.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _spec("Qwen2-7B", "Qwen/Qwen2-7B", layers=28, hidden=3584, heads=28, kv_heads=4, inter=18944,
              vocab=152064, qkv_bias=True, max_pos=131072, params=7_615_616_512),
        _spec("Qwen2.5-32B", "Qwen/Qwen2.5-32B", layers=64, hidden=5120, heads=40, kv_heads=8, inter=27648,
              vocab=152064, qkv_bias=True, max_pos=131072, params=32_763_876_352),
        _spec("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", layers=32, hidden=4096, heads=32, kv_heads=8,
              inter=14336, vocab=128256, qkv_bias=False, max_pos=131072, params=8_030_261_248),
        _spec("Llama-3.1-70B", "meta-llama/Llama-3.1-70B", layers=80, hidden=8192, heads=64, kv_heads=8,
              inter=28672, vocab=128256, qkv_bias=False, max_pos=131072, params=70_553_706_496),
        # The R1 distills keep their base model's architecture (Llama-3.3-70B-Instruct and
        # Qwen2.5-32B respectively); only the weights differ.
        _spec("DeepSeek-R1-Distill-Llama-70B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B", layers=80,
              hidden=8192, heads=64, kv_heads=8, inter=28672, vocab=128256, qkv_bias=False, max_pos=131072,
              params=70_553_706_496),
        _spec("DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", layers=64,
              hidden=5120, heads=40, kv_heads=8, inter=27648, vocab=152064, qkv_bias=True, max_pos=131072,
              params=32_763_876_352),
    )
}

# Suffixes that name a fine-tune of the same architecture (weights differ, shapes do not).
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it", "-hf", "-base")


def normalize_model_name(name: str) -> str:
    """Key used to match a business line's ``model.name`` (or a Hub id) to :data:`MODELS`.

    Lower-cases, drops an ``org/`` prefix, a ``Meta-`` prefix and fine-tune suffixes such as
    ``-Instruct``: ``meta-llama/Meta-Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``,
    ``Qwen2-7B-Instruct`` -> ``qwen2-7b``.
    """
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-")
    key = key.removeprefix("meta-")
    changed = True
    while changed:
        changed = False
        for suffix in _VARIANT_SUFFIXES:
            if key.endswith(suffix):
                key, changed = key[: -len(suffix)], True
    return key


_BY_KEY = {normalize_model_name(n): m for n, m in MODELS.items()}


def lookup_model(name: str) -> ModelSpec:
    """Return the table entry for ``name`` (matched by :func:`normalize_model_name`).

    Raises:
        KeyError: not in the table; the message lists the known models and says to pass a
            Hugging Face ``config.json`` with ``--hf-config PATH`` instead.
    """
    try:
        return _BY_KEY[normalize_model_name(name)]
    except KeyError:
        raise KeyError(
            f"model {name!r} is not in the planner's table (known: {', '.join(MODELS)}); "
            "pass its Hugging Face config.json with --hf-config PATH"
        ) from None


_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def spec_from_hf_config(config: dict[str, Any], *, name: str = "", source: str = "") -> ModelSpec:
    """Build a :class:`ModelSpec` from the fields of a Hugging Face ``config.json``.

    Reads ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (default: the attention heads), ``head_dim`` (default
    hidden/heads), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings`` (default
    false), ``attention_bias`` (default true for ``model_type: qwen2``, else false) and
    ``max_position_embeddings``; the parameter count comes from :func:`count_params`.

    Raises:
        ValueError: a required field is missing or not a positive integer, or the config is
            a mixture-of-experts model (not modelled).
    """
    label = source or "config.json"
    moe = [k for k in _MOE_KEYS if config.get(k)]
    if moe:
        raise ValueError(f"{label}: mixture-of-experts configs ({', '.join(moe)}) are not supported; "
                         "the planner models dense Llama/Qwen2-style models only")
    if "text_config" in config and "num_hidden_layers" not in config:
        config = config["text_config"]

    def positive(key: str, default: Any = None) -> int:
        value = config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{label}: field {key!r} must be a positive integer (got {value!r})")
        return value

    heads = positive("num_attention_heads")
    hidden = positive("hidden_size")
    # Some configs carry explicit nulls; a null means "the default", as in transformers.
    config = {**config, "num_key_value_heads": config.get("num_key_value_heads") or heads,
              "head_dim": config.get("head_dim") or hidden // heads}
    kwargs = dict(
        layers=positive("num_hidden_layers"),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=positive("num_key_value_heads"),
        head_dim=positive("head_dim"),
        intermediate_size=positive("intermediate_size"),
        vocab_size=positive("vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
    )
    params = count_params(**kwargs)
    model_name = name or str(config.get("_name_or_path") or "") or "hf-config"
    return ModelSpec(name=model_name, params=params,
                     max_position_embeddings=int(config.get("max_position_embeddings") or 0),
                     source=source, **kwargs)


def load_hf_config(path: str | Path, *, name: str = "") -> ModelSpec:
    """Read a Hugging Face ``config.json`` from ``path`` (a file, or a directory holding one).

    The model's name is ``name`` if given, else the config's ``_name_or_path``, else the Hub
    repository of a Hugging Face cache path (``models--org--name/snapshots/...``), else
    :func:`describe_architecture` (never the folder name, often a revision hash).

    Raises:
        ValueError: unreadable JSON, not an object, or the fields :func:`spec_from_hf_config`
            needs are missing.
        FileNotFoundError: no such file (the message names the path).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object")
    given = name or str(data.get("_name_or_path") or "") or _hub_repo_id(path) or ""
    spec = spec_from_hf_config(data, name=given, source=str(path))
    return spec if given else replace(spec, name=describe_architecture(spec, data))


def _hub_repo_id(path: Path) -> str | None:
    """``org/name`` when ``path`` lies in a Hugging Face Hub cache
    (``.../models--org--name/snapshots/<revision>/config.json``), else None."""
    for part in reversed(Path(path).resolve().parts):
        if part.startswith("models--") and "--" in part[len("models--"):]:
            return part[len("models--"):].replace("--", "/", 1)
    return None


def describe_architecture(spec: ModelSpec, config: dict[str, Any]) -> str:
    """A name for a config that carries none: the known models with the same architecture
    (``Llama-3.1-8B architecture``), else its class and size (``MistralForCausalLM, 7.24B params``).
    Never the folder it sits in, which is often a revision hash."""
    same = [m.name for m in MODELS.values()
            if (m.layers, m.hidden_size, m.attention_heads, m.kv_heads, m.head_dim, m.intermediate_size,
                m.vocab_size) == (spec.layers, spec.hidden_size, spec.attention_heads, spec.kv_heads, spec.head_dim,
                                  spec.intermediate_size, spec.vocab_size)]
    if same:
        return f"{' / '.join(same)} architecture"
    archs = config.get("architectures")
    kind = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else (
        str(config.get("model_type") or "") or "model")
    return f"{kind}, {spec.params / 1e9:.2f}B params"
