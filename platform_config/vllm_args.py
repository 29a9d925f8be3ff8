"""The one parser of a business line's ``vllm.args`` (pure Python, no cdk8s).

vLLM's command line is parsed by argparse: a flag takes a fixed number of values (0, 1, or one or
more), ``--flag=value`` is the same as ``--flag value``, short aliases (``-tp``) name long flags,
and the last occurrence of a repeated flag wins. Three readers need that structure and read it
from here, so they cannot disagree about what a word is:

* :func:`k8s.lmcache.kv_relevant_vllm_args` (the L2 directory digest) groups the arguments;
* :class:`platform_config.line_models.BusinessLineConfig` compares the parallel sizes with
  ``gpus_per_replica`` (:func:`parallel_sizes`);
* :func:`capacity.fit.parse_vllm_args` reads ``--max-model-len`` and the like.

The number of values of each known flag comes from vLLM ``engine/arg_utils.py`` and
``entrypoints/openai/cli_args.py``; a flag not in the tables takes every word up to the next flag.
"""

from __future__ import annotations

import re
from typing import Final, Iterable

#: vLLM flags that do not change the content or layout of the KV cache of a token sequence (so a
#: change of them keeps a line's L2 directory), with the number of values each takes: 0 (a
#: ``store_true`` / ``BooleanOptionalAction`` flag; ``StoreBoolean`` flags such as
#: ``--enable-chunked-prefill`` also accept an optional ``true``/``false``), 1, or ``"+"`` (one or
#: more, up to the next flag: ``--served-model-name``, ``nargs="+"``).
KV_NEUTRAL_VLLM_FLAG_VALUES: Final[dict[str, int | str]] = {
    "--max-model-len": 1, "--enable-prefix-caching": 0, "--no-enable-prefix-caching": 0,
    "--gpu-memory-utilization": 1, "--max-num-seqs": 1, "--max-num-batched-tokens": 1, "--port": 1, "--host": 1,
    "--served-model-name": "+", "--disable-log-requests": 0, "--disable-log-stats": 0,
    "--enable-chunked-prefill": 0, "--no-enable-chunked-prefill": 0, "--uvicorn-log-level": 1,
    "--max-log-len": 1, "--swap-space": 1, "--block-size": 1, "--enforce-eager": 0, "--chat-template": 1,
    "--response-role": 1, "--tool-call-parser": 1, "--enable-auto-tool-choice": 0,
}
KV_NEUTRAL_VLLM_FLAGS: Final[frozenset[str]] = frozenset(KV_NEUTRAL_VLLM_FLAG_VALUES)
#: KV-relevant vLLM flags whose number of values is known (same sources), so a word after them is
#: placed right whatever the order of the arguments.
KV_RELEVANT_VLLM_FLAG_VALUES: Final[dict[str, int]] = {
    "--model": 1, "--dtype": 1, "--kv-cache-dtype": 1, "--quantization": 1, "--tensor-parallel-size": 1,
    "--pipeline-parallel-size": 1, "--data-parallel-size": 1, "--revision": 1, "--code-revision": 1, "--tokenizer": 1,
    "--tokenizer-revision": 1, "--hf-overrides": 1, "--rope-scaling": 1, "--rope-theta": 1, "--load-format": 1,
    "--trust-remote-code": 0, "--calculate-kv-scales": 0, "--disable-sliding-window": 0,
}
#: vLLM's short aliases (``-tp``, ``-pp``, ``-dp``, ``-q``): written either way, one flag.
VLLM_FLAG_ALIASES: Final[dict[str, str]] = {
    "-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
    "-q": "--quantization",
}
#: The flags whose product is the number of GPUs one vLLM server uses; each defaults to 1 (vLLM
#: ``ParallelConfig``), so a server started without them uses one GPU whatever the pod was given.
TENSOR_PARALLEL_FLAG: Final = "--tensor-parallel-size"
PIPELINE_PARALLEL_FLAG: Final = "--pipeline-parallel-size"
DATA_PARALLEL_FLAG: Final = "--data-parallel-size"
PARALLEL_FLAGS: Final = (TENSOR_PARALLEL_FLAG, PIPELINE_PARALLEL_FLAG, DATA_PARALLEL_FLAG)

#: vLLM's KV connector flag. The platform renders it on every vLLM pod of an L2 line (the
#: operator's value completed with ``kv_load_failure_policy: recompute``: :mod:`k8s.kv_transfer`).
KV_TRANSFER_FLAG: Final = "--kv-transfer-config"
#: Flags ``vllm.args`` may not set, each with why: the platform owns them on every pod.
OWNED_VLLM_FLAGS: Final[dict[str, str]] = {
    KV_TRANSFER_FLAG: ("the platform renders it on every vLLM pod (LMCache's connector with "
                       "kv_load_failure_policy recompute, docs/l2-cache.md); vLLM keeps only the last "
                       "one, so a value here would drop or be dropped"),
}

#: Flags ``vllm.args`` may not set, each with why: they turn off what the platform is built on.
REFUSED_VLLM_FLAGS: Final[dict[str, str]] = {
    "--no-enable-prefix-caching": ("it turns off L0, vLLM's GPU prefix cache, which the three KV tiers build on (the "
                                   "README: L0 always on): every request would load its whole prefix from L1/L2 or "
                                   "prefill it again"),
}
#: vLLM 0.29's ``--max-model-len`` forms (``human_readable_int_or_auto``, ``vllm/utils/argparse_utils.py``):
#: a whole number, a number with a decimal suffix k/m/g/t (10^3...; decimals allowed: ``25.6k``) or a
#: binary one K/M/G/T (2^10...; whole numbers only), or ``-1`` / ``auto`` (vLLM picks the model's).
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """An integer as vLLM 0.29 reads ``--max-model-len`` and its token-count flags
    (``human_readable_int``, ``vllm/utils/argparse_utils.py``): ``8192``, ``8k`` = 8,000, ``8K`` =
    8,192, ``25.6k`` = 25,600; without a suffix, what Python's ``int()`` reads (``1_000``, ``+8``, ``-1``),
    vLLM's fallback.

    Raises:
        ValueError: anything else (a binary suffix with decimals included, as vLLM refuses it); the
            message names the value and the allowed forms.
    """
    value = text.strip()
    match = _HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if number.isdigit():
            return int(number) * _BINARY[suffix]
    else:
        try:
            return int(value)  # vLLM's fallback: Python's int(), so 1_000, +8 and -1 are numbers too
        except ValueError:
            pass
    raise ValueError(f"{text!r} is not a token count vLLM reads; allowed: a whole number (8192), a decimal suffix "
                     "k/m/g/t (8k = 8,000; 25.6k), a binary suffix K/M/G/T on a whole number (8K = 8,192)")


def human_readable_int_or_auto(text: str) -> int:
    """vLLM 0.29's ``human_readable_int_or_auto`` (``vllm/utils/argparse_utils.py``): ``-1`` for ``-1``
    or ``auto`` (any case), else :func:`human_readable_int`.

    Raises:
        ValueError: as :func:`human_readable_int`.
    """
    return -1 if text.strip() == "-1" or text.strip().lower() == "auto" else human_readable_int(text)


def max_model_len(args: Iterable[str]) -> int | None:
    """``--max-model-len`` of ``args`` (the last one), in tokens, as vLLM 0.29 reads it; None when it
    is not set or is ``-1`` / ``auto`` (vLLM then uses the model's own length).

    Raises:
        ValueError: a value vLLM would refuse (:func:`human_readable_int`).
    """
    values = flag_values(args).get("--max-model-len")
    if values is None:
        return None
    text = " ".join(values)
    try:
        length = human_readable_int_or_auto(text)
    except ValueError as exc:
        raise ValueError(f"--max-model-len {exc}, or -1 / auto (the model's own length)") from None
    if length == -1:
        return None
    if length < 1:
        raise ValueError(f"--max-model-len {text!r} must be at least 1 token; allowed: 1 or more, or -1 / auto")
    return length


def model_path(args: Iterable[str]) -> str | None:
    """The model vLLM serves: ``--model`` (the last one) or else the first positional argument of
    ``args`` (``vllm serve <model>``); None when neither is given."""
    groups = group_vllm_args(args)
    flagged = [g[1] for g in groups if g[0] == "--model" and len(g) > 1]
    if flagged:
        return flagged[-1]
    positionals = [g[0] for g in groups if not is_flag(g[0])]
    return positionals[0] if positionals else None


def owned_flags_in(args: Iterable[str]) -> list[str]:
    """The words of ``args`` that set a flag of :data:`OWNED_VLLM_FLAGS` or :data:`REFUSED_VLLM_FLAGS`, in every spelling vLLM's
    parser accepts: ``--flag``, ``--flag=value``, ``--flag.key value`` (vLLM's dotted JSON keys) and
    underscores for dashes (vLLM's ``FlexibleArgumentParser`` reads ``--kv_transfer_config`` too)."""
    found = []
    for arg in args:
        if not is_flag(arg):
            continue
        name = arg.partition("=")[0].partition(".")[0]
        if "--" + name[2:].replace("_", "-") in {**OWNED_VLLM_FLAGS, **REFUSED_VLLM_FLAGS}:
            found.append(arg)
    return found


def is_flag(arg: str) -> bool:
    """``--x``/``-x`` is a flag; ``-1``, ``-0.5`` (a negative number) and ``-`` are values."""
    return arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit() and arg[1] != "."


def group_vllm_args(args: Iterable[str]) -> list[list[str]]:
    """Split a vLLM command line into groups, in order: ``[positional]`` or ``[flag, values...]``.

    ``--flag=value`` becomes ``["--flag", "value"]``; a short alias becomes its long flag
    (:data:`VLLM_FLAG_ALIASES`). A flag takes as many following words as the tables above say, so
    a word after a flag without value stays a positional (``["--enforce-eager"], ["/opt/ml/model"]``);
    a ``StoreBoolean`` flag takes an optional ``true``/``false``; an unknown flag takes every word
    up to the next flag (when in doubt, the word belongs to the flag).
    """
    items = list(args)
    groups: list[list[str]] = []
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if not is_flag(arg):
            groups.append([arg])
            continue
        flag, sep, value = arg.partition("=")
        flag = VLLM_FLAG_ALIASES.get(flag, flag)
        group = [flag] + ([value] if sep else [])
        wanted = KV_NEUTRAL_VLLM_FLAG_VALUES.get(flag, KV_RELEVANT_VLLM_FLAG_VALUES.get(flag, "+"))
        if not sep:
            if wanted == 0:  # at most an optional boolean (StoreBoolean flags)
                if i < len(items) and items[i].lower() in ("true", "false"):
                    group.append(items[i])
                    i += 1
            elif wanted == 1:
                if i < len(items):
                    group.append(items[i])
                    i += 1
            else:  # "+": every word up to the next flag
                while i < len(items) and not is_flag(items[i]):
                    group.append(items[i])
                    i += 1
        groups.append(group)
    return groups


def flag_values(args: Iterable[str]) -> dict[str, list[str]]:
    """Each flag of ``args`` (long names) -> the values of its last occurrence (argparse: the last
    one wins); a flag without values maps to ``[]``. Positionals are left out."""
    return {g[0]: g[1:] for g in group_vllm_args(args) if is_flag(g[0])}


#: vLLM's prefix-cache (L0) hash flag and the algorithms of it the platform refuses: not collision
#: resistant (vLLM 0.29.0 ``vllm/v1/core/kv_cache_utils.py`` ``_NON_CRYPTO_HASH_FUNCTIONS``), and
#: keyed only by ``NONE_HASH``, which the platform's ``PYTHONHASHSEED`` makes predictable
#: (``resolve_none_hash_seed``: the variable wins over vLLM's random seed), so crafted prompts could
#: collide in L0 (GHSA-rm76-4mrf-v9r8). vLLM's default, ``sha256``, and ``sha256_cbor`` are allowed.
PREFIX_CACHING_HASH_FLAG: Final = "--prefix-caching-hash-algo"
REFUSED_PREFIX_CACHING_HASHES: Final = ("xxhash", "xxhash_cbor")


def prefix_caching_hash_algo(args: Iterable[str]) -> str | None:
    """The value of the last ``--prefix-caching-hash-algo`` of ``args`` (``--flag value``,
    ``--flag=value``, underscores for dashes), or None when it is not set (vLLM's default, ``sha256``)."""
    value = None
    for group in group_vllm_args(args):
        if is_flag(group[0]) and "--" + group[0][2:].replace("_", "-") == PREFIX_CACHING_HASH_FLAG:
            value = " ".join(group[1:])
    return value


def parallel_sizes(args: Iterable[str]) -> dict[str, int]:
    """The parallel sizes ``args`` set: flag (:data:`PARALLEL_FLAGS`, long name) -> size; a flag
    that is not set is absent (vLLM's default for it is 1).

    Reads ``--tensor-parallel-size N``, ``--tensor-parallel-size=N``, ``-tp N`` and the same forms
    of ``--pipeline-parallel-size`` / ``-pp`` and ``--data-parallel-size`` / ``-dp``; the last
    occurrence wins.

    Raises:
        ValueError: a value that is not a whole number of at least 1; the message names the flag,
            the value and what is allowed.
    """
    found = flag_values(args)
    sizes: dict[str, int] = {}
    for flag in PARALLEL_FLAGS:
        if flag not in found:
            continue
        text = " ".join(found[flag])
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{flag} {text!r} is not a whole number; allowed: an integer of at least 1, "
                             f"e.g. {flag} 2")
        sizes[flag] = int(text)
    return sizes
