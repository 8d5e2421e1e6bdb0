"""Write a tiny random-weight Llama and a locally trained BPE tokenizer into a folder.

Run with the vLLM venv's Python (scripts/vllm-venv.sh); it needs ``torch``,
``transformers`` and ``tokenizers``, which vLLM brings, and downloads nothing. The model
is the engine's shape only (two layers, four heads of 64, two KV heads): its answers are
noise, but vLLM schedules, caches and meters it exactly as it would a real model, which
is all the referee suite reads. Seeded, so the same folder comes out every time.

    python scripts/make_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

WORDS = [
    "cache",
    "prefix",
    "block",
    "token",
    "request",
    "replica",
    "policy",
    "latency",
    "budget",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "on",
    "for",
    "with",
    "model",
    "engine",
    "pool",
    "hit",
    "rate",
    "user",
    "assistant",
    "system",
    "tool",
    "json",
    "time",
    "date",
    "id",
    "doc",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def corpus(lines: int = 4000, seed: int = 0) -> Iterator[str]:
    """Lines of the words above and digits, for the tokenizer to learn merges from."""
    rng = random.Random(seed)
    for _ in range(lines):
        yield " ".join(
            rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randint(0, 99))
            for _ in range(rng.randint(5, 40))
        )


def main(out: Path) -> None:
    """Train the tokenizer, build the model, save both into ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / ".complete").touch()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
