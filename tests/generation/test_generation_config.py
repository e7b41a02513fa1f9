"""A checkpoint's generation_config.json honoured end to end: tiny llama checkpoint folders
whose generation config sets the logit processors, compiled with `dayzero compile FOLDER`
(the artifact carries the file), generate a batch of two prompts of different lengths with
transformers' greedy tokens, transformers' `generate` running on the folder as it is loaded
from disk (a first difference is allowed only where transformers' top-2 processed scores are
within 1e-4: a tie). A call's arguments override the config; Marian's forced EOS ends every
sequence that reaches its length; the loader refuses a bad file naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import runtime
from compiler.cli import main
from compiler.errors import ArtifactError, InputError
from runtime.generation.generation_config import FILE, read_generation_config
from tests.generation.tiny_lms import checkpoint_folder

NEW = 10
CONFIG = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[5], [7, 9]],
          "min_new_tokens": 3, "suppress_tokens": [11, 12], "begin_suppress_tokens": [13],
          "forced_eos_token_id": 2, "eos_token_id": [2, 250]}
# Marian's generation config: the pad token is a bad word, EOS forced at the length, beams
MARIAN = {"bad_words_ids": [[0]], "forced_eos_token_id": 2, "num_beams": 4, "max_length": 512}
OFF = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "bad_words_ids": [],
       "min_new_tokens": 0, "suppress_tokens": [], "begin_suppress_tokens": [],
       "forced_eos_token_id": []}


def _compiled(root: Path, config: dict) -> Path:
    hf = checkpoint_folder(root / "ckpt")
    for key, value in config.items():
        setattr(hf.generation_config, key, value)
    hf.generation_config.save_pretrained(root / "ckpt")
    out = root / "lm.dz"
    assert main(["compile", str(root / "ckpt"), "-o", str(out), "--seq-len", "2:64", "-q"]) == 0
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _compiled(tmp_path_factory.mktemp("genconfig"), CONFIG)


def _prompts() -> list[np.ndarray]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 256, (n,), generator=g).numpy() for n in (5, 13)]


def _transformers(root: Path, ids: np.ndarray, **kwargs):
    """transformers' greedy new tokens for one prompt, on the folder as it loads it (its
    generation_config.json included), and its processed scores per step."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(root / "ckpt").eval()
    tensor = torch.as_tensor(ids)[None]
    with torch.no_grad():
        out = hf.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=NEW,
                          do_sample=False, output_scores=True, return_dict_in_generate=True,
                          pad_token_id=0, **kwargs)
    return out.sequences[0, len(ids):].tolist(), [s[0].numpy() for s in out.scores]


def _new_tokens(batch: np.ndarray, prompts: list[np.ndarray]) -> list[list[int]]:
    """Each row's generated tokens (generate pads stopped rows with -1 here)."""
    width = max(len(p) for p in prompts)
    return [[t for t in row[width:].tolist() if t != -1] for row in batch]


def _assert_same(got: list[int], want: list[int], scores: list[np.ndarray]) -> None:
    """Equal tokens, or equal up to a first difference that follows a top-2 tie."""
    common = min(len(got), len(want))
    differ = [i for i in range(common) if got[i] != want[i]]
    if not differ:
        assert len(got) == len(want), (got, want)
        return
    top2 = np.sort(scores[differ[0]])[-2:]
    assert top2[1] - top2[0] < 1e-4, (f"token {differ[0]} differs: {got} vs {want}, "
                                      f"transformers' top-2 margin {top2[1] - top2[0]}")


def _generate_both(root: Path, call: dict | None = None, model=None,
                   **theirs) -> list[list[int]]:
    model = model or runtime.load(root / "lm.dz")
    prompts = _prompts()
    got = _new_tokens(model.generate(prompts, max_new_tokens=NEW, pad_token_id=-1,
                                     **(call or {})), prompts)
    for row, ids in enumerate(prompts):
        _assert_same(got[row], *_transformers(root, ids, **theirs))
    return got


def test_the_checkpoint_config_gives_transformers_tokens(folder):
    model = runtime.load(folder / "lm.dz")
    # several EOS ids, from the file (the manifest has the model config's, as transformers
    # generate stops at the file's)
    assert model.logit_processors.eos_token_ids == (2, 250)
    assert set(model.logit_processors.names) == set(CONFIG) - {"eos_token_id"}
    got = _generate_both(folder)
    prompts = _prompts()
    plain = _new_tokens(model.generate(prompts, max_new_tokens=NEW, pad_token_id=-1, **OFF),
                        prompts)
    assert got != plain  # the config changed the tokens
    for tokens in got:
        assert 13 not in tokens[:1] and not {5, 11, 12} & set(tokens)
        bigrams = list(zip(tokens, tokens[1:]))
        assert len(bigrams) == len(set(bigrams))
        assert len(tokens) < NEW or tokens[-1] == 2  # forced EOS at the length


def test_a_call_overrides_the_checkpoint_config(folder):
    call = {"no_repeat_ngram_size": 3, "repetition_penalty": 1.1, "suppress_tokens": [],
            "min_new_tokens": 0}
    _generate_both(folder, call, **call)


def test_several_eos_ids_stop_a_row_and_are_held_back_together(folder):
    """EOS [2, X] with X a token row 0 makes at step k >= 3 (after min_new_tokens holds every
    EOS id back) and not before: row 0 stops at step k, as in transformers."""
    got = _generate_both(folder)
    k = next(i for i in range(3, len(got[0])) if got[0][i] not in got[0][:i] + [2])
    eos = [2, got[0][k]]
    stopped = _generate_both(folder, {"eos_token_id": eos}, eos_token_id=eos)
    assert stopped[0] == got[0][:k + 1]


def test_stream_and_generate_text_take_the_config_and_its_overrides(folder):
    model = runtime.load(folder / "lm.dz")
    prompts = _prompts()
    batch = _new_tokens(model.generate(prompts, max_new_tokens=NEW, pad_token_id=-1), prompts)
    streamed = [[], []]
    for row, token in model.stream(prompts, max_new_tokens=NEW):
        streamed[row].append(token)
    assert streamed == batch
    text = model.generate_text("hello world the", max_new_tokens=4, suppress_tokens=[])
    assert isinstance(text, str)
    with pytest.raises(InputError) as info:
        model.generate_text("hello world the", max_new_tokens=4, repetition_penalty=-1.0)
    assert info.value.where == "repetition_penalty"
    with pytest.raises(InputError) as info:
        model.generate(prompts, max_new_tokens=4, no_repeat_ngrams=2)
    assert info.value.where == "no_repeat_ngrams"


def test_marian_forced_eos_ends_every_sequence_at_its_length(tmp_path):
    root = _compiled(tmp_path, MARIAN)
    with pytest.warns(UserWarning, match="num_beams"):
        model = runtime.load(root / "lm.dz")
    # transformers would search 4 beams; greedy is compared (num_beams=1), the rest as saved
    got = _generate_both(root, model=model, num_beams=1)
    assert all(tokens[-1] == 2 for tokens in got)
    assert all(len(tokens) == NEW for tokens in got)  # no earlier EOS in this model's tokens


# -- the file, read at load: bounded and checked --------------------------------------------
def _stub(tmp_path: Path, text: str | None):
    """What read_generation_config uses of a loaded step: the manifest's tokenizer list, the
    artifact's file lookup, its path."""
    path = tmp_path / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    names = []
    if text is not None:
        path.write_text(text)
        names = [FILE]
    return SimpleNamespace(manifest={"generation": {"tokenizer": names}}, path=tmp_path,
                           artifact=SimpleNamespace(file=lambda rel, what: tmp_path / rel))


SPEC = SimpleNamespace(vocab_size=256, eos_token_ids=(2,))


@pytest.mark.parametrize("text, words", [
    ('{"repetition_penalty": -1}', "repetition_penalty"),
    ('{"bad_words_ids": [[300]]}', "bad_words_ids"),
    ("[1, 2]", "not an object"),
    ('{"a": NaN}', "not a generation config"),
    ("[" * 100 + "]" * 100, "nested"),
])
def test_a_bad_generation_config_file_is_refused_at_load(tmp_path, text, words):
    with pytest.raises(ArtifactError) as info:
        read_generation_config(_stub(tmp_path, text), SPEC)
    assert words in info.value.message() and FILE in info.value.where


def test_an_artifact_without_the_file_has_no_processors(tmp_path):
    assert not read_generation_config(_stub(tmp_path, None), SPEC).active
    good = read_generation_config(_stub(tmp_path, json.dumps({"min_new_tokens": 2})), SPEC)
    assert good.names == ("min_new_tokens",) and good.eos_token_ids == (2,)


def test_a_folder_without_a_tokenizer_still_carries_its_generation_config(tmp_path):
    """Marian-like sweep folders have no tokenizer.json: the generation config travels alone
    (its processors act on ids), and the artifact has no tokenizer."""
    hf = checkpoint_folder(tmp_path / "ckpt")
    hf.generation_config.forced_eos_token_id = 2
    hf.generation_config.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "tokenizer.json").unlink()
    out = tmp_path / "lm.dz"
    assert main(["compile", str(tmp_path / "ckpt"), "-o", str(out), "--seq-len", "2:64",
                 "-q"]) == 0
    assert json.loads((out / "manifest.json").read_text())["generation"]["tokenizer"] == [FILE]
    lm = runtime.load(out)
    assert lm.tokenizer is None and lm.logit_processors.active
    ids = lm.generate(_prompts()[0][None], max_new_tokens=4)
    assert ids[0, -1] == 2  # forced at the last position


def test_a_bad_generation_config_is_refused_at_compile_time(tmp_path, capsys):
    checkpoint_folder(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "repetition_penalty": -1}))
    assert main(["compile", str(tmp_path / "ckpt"), "-o", str(tmp_path / "lm.dz"),
                 "--seq-len", "2:64", "-q"]) == 1
    err = capsys.readouterr().err
    assert "generation_config.json" in err and "repetition_penalty" in err, err
