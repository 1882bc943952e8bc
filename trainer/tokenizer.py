"""Tokenizers behind one small interface: character-level for the built-in model, the model's
own tokenizer (transformers `AutoTokenizer`, from the model directory) for HF models."""
from __future__ import annotations

import string
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


# Everything the built-in task families write; unknown characters map to <unk>.
DEFAULT_CHARSET = string.digits + string.ascii_letters + " +-*/=()<>:,.;?!'\"[]{}_#|\n"


class CharTokenizer:
    """One id per character. Ids 0..3 are <pad>, <bos>, <eos>, <unk>."""

    def __init__(self, charset: str = DEFAULT_CHARSET) -> None:
        chars = list(dict.fromkeys(charset))
        self.specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.stoi = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self.itos = {i: c for c, i in self.stoi.items()}
        self.vocab_size = len(self.specials) + len(chars)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos.get(int(i), "") for i in ids)


class HFTokenizer:
    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = len(self.tok)
        eos = self.tok.eos_token_id
        if eos is None:
            raise ValueError(f"tokenizer in {path!r} has no eos token")
        self.eos_id = eos
        self.bos_id = self.tok.bos_token_id if self.tok.bos_token_id is not None else eos
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else eos

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)
