"""The test checkpoints' tokenizer: a byte-level BPE trained on the bundled corpus, deterministically.

Nothing is downloaded: ``corpus.txt`` beside this file is the training text, special tokens
have fixed ids, and the chat template is ChatML. `make_model` writes these files into every
checkpoint it generates.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from quire_tools.checkpoint_dir import write_json

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
VOCAB_SIZE = 4096
# Order fixes the ids: <pad>=0, <s>=1, </s>=2, <|im_start|>=3, <|im_end|>=4.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN = SPECIAL_TOKENS
PAD_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(len(SPECIAL_TOKENS))

# transformers 5 loads model_type "qwen2" with Qwen2Tokenizer, which keeps only the vocab,
# merges and post-processor of tokenizer.json and rebuilds the rest as NFC + this split +
# ByteLevel. Qwen2 checkpoints get exactly that pipeline, so tokenizer.json and AutoTokenizer
# agree (at the price of NFC: only NFC text round-trips byte-exactly there).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML; the template writes bos itself because apply_chat_template encodes the rendered
# text with add_special_tokens=False.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@functools.cache
def tokenizer_json(style: str = "gpt2") -> str:
    """Train the byte-level BPE tokenizer on the bundled corpus and return its tokenizer.json.

    `style` "gpt2" splits words with the GPT-2 regex and round-trips any UTF-8 text; "qwen2"
    matches what transformers rebuilds for Qwen2 (see QWEN2_SPLIT_REGEX). Deterministic: the
    BPE trainer breaks count ties by pair ids, which follow byte order.
    """
    tokenizer = Tokenizer(models.BPE())
    if style == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif style == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(f"unknown tokenizer style {style!r}")
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS_PATH.read_text(encoding="utf-8").splitlines(keepends=True)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    # Encoding a prompt prepends <s>, with the plain `tokenizers` library as well as with HF.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, f"{token} must have id {token_id}"
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, "corpus too small for the target vocab"
    return tokenizer.to_str(pretty=True)


def tokenizer_style(config: dict[str, Any]) -> str:
    # transformers 5 loads Qwen3 and Qwen3-MoE checkpoints with Qwen2Tokenizer too.
    return "qwen2" if config["model_type"] in ("qwen2", "qwen3", "qwen3_moe") else "gpt2"


def write_tokenizer(out: Path, config: dict[str, Any]) -> None:
    (out / "tokenizer.json").write_text(tokenizer_json(tokenizer_style(config)), encoding="utf-8")
    extra_special_tokens = [IM_START_TOKEN, IM_END_TOKEN]
    tokenizer_config = {
        "tokenizer_class": "TokenizersBackend",
        "backend": "tokenizers",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        # Byte-level BPE never needs one; an explicit null also stops Qwen2Tokenizer from
        # appending its default "<|endoftext|>" unk token past the model's vocab.
        "unk_token": None,
        "extra_special_tokens": extra_special_tokens,
        # Informational: transformers 5 ignores add_*_token when tokenizer.json exists and
        # takes bos from its post-processor; other loaders read these flags.
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "tokenizer_config.json", tokenizer_config)
    special_tokens_map = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": extra_special_tokens,
    }
    write_json(out / "special_tokens_map.json", special_tokens_map)
    # transformers 5 reads chat_template.jinja (it wins over tokenizer_config's copy).
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
