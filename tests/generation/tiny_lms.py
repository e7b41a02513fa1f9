"""Tiny transformers causal LMs with random weights, and their generation artifacts.

One factory per architecture the generation issue names; each is the model class as
transformers ships it (nobody here wrote it), shrunk to 2 layers of width 64 over a 256-token
vocabulary, in the `input_ids -> logits` form users export (`use_cache=False`).
"""

from __future__ import annotations

from pathlib import Path

import torch

MAX_SEQ = 256
_COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=MAX_SEQ,
               attn_implementation="sdpa", tie_word_embeddings=False)


def _llama(t):
    return t.LlamaForCausalLM(t.LlamaConfig(**_COMMON, num_key_value_heads=2))


def _gpt2(t):
    return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                                          n_positions=MAX_SEQ, attn_implementation="sdpa",
                                          bos_token_id=1, eos_token_id=2))


def _qwen3(t):
    return t.Qwen3ForCausalLM(t.Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=16))


def _phi3(t):
    return t.Phi3ForCausalLM(t.Phi3Config(**_COMMON, num_key_value_heads=2, pad_token_id=0,
                                          bos_token_id=1, eos_token_id=2))


def _mistral(t):
    return t.MistralForCausalLM(t.MistralConfig(**_COMMON, num_key_value_heads=2,
                                                sliding_window=4))


def _gemma2(t):
    return t.Gemma2ForCausalLM(t.Gemma2Config(**{**_COMMON, "attn_implementation": "eager"},
                                              num_key_value_heads=2, head_dim=16,
                                              sliding_window=4))


FACTORIES = {"llama": _llama, "gpt2": _gpt2, "qwen3": _qwen3, "phi3": _phi3,
             "mistral": _mistral, "gemma2": _gemma2}


class CausalLM(torch.nn.Module):
    """input_ids -> logits, the cache off: the SPEC form of a causal LM."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def tiny_lm(name: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return FACTORIES[name](transformers).eval()


def compile_lm(hf: torch.nn.Module, out: Path, backend: str = "onnxruntime",
               **config) -> Path:
    import compiler

    example = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    seq = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    generation = {"kv_cache_memory": "4MiB", **config}
    return compiler.compile(CausalLM(hf), (example,), out=out, backend=backend,
                            dynamic_shapes=({1: seq},), task="text-generation",
                            config={"generation": generation})


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))


WORDS = ["hello", "world", "the", "model", "runs", "on", "day", "zero", "a", "cat", "sat",
         "user", "assistant", ":", "!", "?"]
CHAT = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
        "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


def word_tokenizer():
    """A whole-word tokenizer over WORDS (and w<id> fillers up to 256 ids) with a chat
    template, as transformers saves one: tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), 256)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", chat_template=CHAT)


def checkpoint_folder(path: Path) -> torch.nn.Module:
    """A tiny llama checkpoint folder at `path` (BOS 1, EOS 2) with `word_tokenizer`, as
    `dayzero compile FOLDER` reads one; the model, for reference outputs."""
    hf = tiny_lm("llama")
    hf.config.bos_token_id, hf.config.eos_token_id = 1, 2
    hf.generation_config.bos_token_id, hf.generation_config.eos_token_id = 1, 2
    hf.save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return hf
