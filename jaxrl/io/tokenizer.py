"""Tokenizers: the built-in character tokenizer for tiny models, and HF tokenizer directories.

The built-in tokenizer has one token per printable ASCII character (plus newline) and five special tokens,
wrapped
in a `transformers.PreTrainedTokenizerFast` with a minimal chat template, so the trainer treats it exactly
like a
real HF tokenizer. It is built in code in milliseconds (no asset file), so it is deterministic by
construction:
the same text always gives the same ids on every machine. Characters outside the alphabet map to `<|unk|>`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
# AutoTokenizer is imported where a tokenizer directory is read: its import pulls in torch when torch is
# installed (2 s per process), which the built-in tokenizer never needs
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from jaxrl.errors import ConfigError

PAD, EOS, UNK, SYSTEM, USER, ASSISTANT = (
    "<|pad|>",
    "<|eos|>",
    "<|unk|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
)
SPECIALS = (PAD, EOS, UNK, SYSTEM, USER, ASSISTANT)
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}" + SYSTEM + "{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% else %}" + ASSISTANT + "{{ m['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer: ids 0..5 are the special tokens (pad=0, eos=1), then one id per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(ALPHABET)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def load_tokenizer(kind: str = "builtin", path: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    """`kind="builtin"` → `builtin_tokenizer()`; `kind="hf"` → a local HF tokenizer directory (offline, no
    remote
    code). A tokenizer without a pad token gets its eos token as pad."""
    if kind == "builtin":
        return builtin_tokenizer()
    if kind != "hf":
        raise ConfigError(f"tokenizer.kind={kind!r}: allowed values are 'builtin', 'hf'")
    if path is None or not Path(path).is_dir():
        raise ConfigError(f"tokenizer.path={str(path)!r}: not a directory with tokenizer files")
    try:
        tok = from_pretrained_dir(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"tokenizer.path={str(path)!r}: cannot load a tokenizer: {e}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def from_pretrained_dir(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """`AutoTokenizer` of a local directory: offline, `trust_remote_code=False` (no interactive prompt, never
    anyone's code). For our own `JaxrlForCausalLM` exports (model_type `jaxrl_decoder`) transformers gets a
    generic config instead of reading ours, which it could only resolve through the remote code."""
    from transformers import AutoTokenizer, PretrainedConfig

    extra = {"config": PretrainedConfig()} if _is_own_remote_code_export(Path(path)) else {}
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False, **extra)


def _is_own_remote_code_export(directory: Path) -> bool:
    try:
        return json.loads((directory / "config.json").read_text()).get("model_type") == "jaxrl_decoder"
    except (OSError, ValueError, AttributeError):
        return False
