"""A tiny Llama-architecture model with random weights and a word-level tokenizer, made at test time.

vLLM's ``--load-format dummy`` fills every weight with the same small values, so every logit is
equal and greedy decoding cannot tell a right KV cache from a wrong one; and no model can be
downloaded here. So the tier writes its own model directory once per session:

* ``config.json`` / ``generation_config.json`` / ``model.safetensors``: a ``LlamaForCausalLM``
  (transformers' ``LlamaConfig``) with :data:`GEOMETRY` and weights drawn from a fixed seed
  (:data:`SEED`), so every run of the tier serves the same model. float32: exact enough on CPU
  that a completion computed over a loaded KV cache equals one computed from scratch.
* ``tokenizer.json`` / ``tokenizer_config.json``: a ``tokenizers`` WordLevel model over a
  synthetic vocabulary (``<unk>``, ``<s>``, ``</s>``, then ``w3`` ... ``w31999``), split on
  whitespace, so a prompt of N words is exactly N tokens (plus ``<s>``): chunk boundaries
  (256 tokens, ``LMCACHE_CHUNK_SIZE``) are where the test puts them.

KV bytes per token (float32, K and V): 2 x 8 layers x 4 KV heads x 64 x 4 B = 16 KiB; a 256-token
chunk file is 4 MiB (plus LMCache's header).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The model's shape. head_dim 64 is one of vLLM's CPU attention head sizes
#: (``CPUAttentionBackend.get_supported_head_sizes``, vllm/v1/attention/backends/cpu_attn.py);
#: max_position_embeddings covers the rendered ``--max-model-len 8192`` of rag-assistant.
GEOMETRY = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 8192}
#: Special tokens at the start of the vocabulary (ids 0, 1, 2), as in Llama tokenizers.
SPECIALS = ("<unk>", "<s>", "</s>")
SEED = 20261202
#: A plain chat template (role, then content, per message), for ``/tokenize`` of chat messages
#: (the hot-prefix warmer tokenizes a line's system prompt that way). Words outside the synthetic
#: vocabulary are ``<unk>``: the token ids are still a deterministic function of the text.
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }} {{ message['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")
#: Standard deviation of the random weights: larger than Llama's 0.02 so that the logits of the
#: random model have clear maxima (greedy decoding is stable against float32 rounding).
INIT_STD = 0.05


def word(token_id: int) -> str:
    """The vocabulary word of ``token_id`` (>= 3): ``w<id>``."""
    return f"w{token_id}"


def make_tokenizer(out: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {name: i for i, name in enumerate(SPECIALS)}
    vocab.update({word(i): i for i in range(len(SPECIALS), GEOMETRY["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # A BOS token in front, as Llama's tokenizers add it (vLLM's /tokenize shows it).
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "model_max_length": GEOMETRY["max_position_embeddings"],
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}, indent=1), encoding="utf-8")


def make_model(out: Path) -> Path:
    """Write the model and tokenizer into ``out`` (created); return ``out``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**GEOMETRY, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                         initializer_range=INIT_STD, rms_norm_eps=1e-5, rope_theta=10000.0)
    config.dtype = "float32"
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(out))
    make_tokenizer(out)
    return out


def prompt(seed: int, n_words: int) -> str:
    """A prompt of ``n_words`` vocabulary words drawn from ``seed`` (``n_words`` + 1 tokens with <s>).
    Distinct seeds give prefixes that share no chunk."""
    import random

    rng = random.Random(seed)
    return " ".join(word(rng.randrange(len(SPECIALS), GEOMETRY["vocab_size"])) for _ in range(n_words))


if __name__ == "__main__":
    import sys

    print(make_model(Path(sys.argv[1])))
