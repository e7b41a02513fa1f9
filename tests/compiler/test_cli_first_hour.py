"""The command line in a new user's first hour (issue 41): every wrong call says what is wrong,
before the model loads; `compile --help` explains each option; the generation settings have
flags; the fusion report shows what is worth reading; a checkpoint whose tokenizer is short of
the model's vocabulary is warned of."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compiler.cli import build_parser, main
from tests.compiler.conftest import MLP

ROOT = Path(__file__).resolve().parents[2]
NEAR_MISSES = f"{ROOT}/tests/passes/near_miss_model.py:build"


# -- align and inspect: a path that is not what they take --------------------------------------

@pytest.mark.parametrize("target, named", [("nosuch.dz", "nosuch.dz"),
                                            ("nosuch.py:build", "nosuch.py")])
def test_align_of_nothing_says_no_artifact_or_spec_exists(target, named, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["align", target]) == 1
    err = capsys.readouterr().err
    assert f"error: no artifact or SPEC exists at {named}\n" in err
    assert "is not of the form" not in err and "[load]" not in err


def test_inspect_of_a_file_that_is_not_ir_says_so(mlp_artifact, tmp_path, capsys):
    assert main(["inspect", str(ROOT / "README.md")]) == 1
    err = capsys.readouterr().err
    assert f"error: {ROOT / 'README.md'} is neither an artifact nor a .dzir IR file" in err
    assert "syntax error" not in err
    assert main(["inspect", str(mlp_artifact / "manifest.json")]) == 1
    assert f"fix: give the artifact directory {mlp_artifact}, not its manifest" in \
        capsys.readouterr().err
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert main(["inspect", str(tmp_path / "image.png")]) == 1
    assert "is neither an artifact nor a .dzir IR file" in capsys.readouterr().err
    # IR text under another name is still IR; a broken .dzir still gets its syntax error
    (tmp_path / "graph.txt").write_text((mlp_artifact / "graph.dzir").read_text())
    assert main(["inspect", str(tmp_path / "graph.txt")]) == 0
    assert "\ngraph " in "\n" + capsys.readouterr().out
    (tmp_path / "bad.dzir").write_text("not ir\n")
    assert main(["inspect", str(tmp_path / "bad.dzir")]) == 1
    assert "syntax error" in capsys.readouterr().err


# -- compile: everything the command line decides is checked before the SPEC runs --------------

_MARKED_SPEC = ("from pathlib import Path\n"
                "Path(__file__).with_name('imported').write_text('the SPEC ran')\n"
                "import torch\n"
                "def build():\n"
                "    return torch.nn.Linear(4, 2), (torch.ones(3, 4),)\n")


@pytest.mark.parametrize("flags, message", [
    (["--backend", "nosuch"], "unknown backend 'nosuch'"),
    (["--fallback", "nosuch"], "unknown backend 'nosuch'"),
    (["--config", "{tmp}/bad.yaml"], "unknown config key 'precision.weight_dtyp'"),
    (["--config", "{tmp}/none.yaml"], "does not exist"),
    (["--weight-dtype", "fp8"], "'precision.weight_dtype: fp8' is valid but not supported"),
    (["--passes", "remove_noops,nosuch_pass"], "nosuch_pass"),
    (["--backend-option", "nosuch:x=1"], "'backend_options.nosuch' names no registered"),
    (["--html", "{tmp}/f.html"], "it needs --report"),
    (["--task", "text-generation", "--config", "{tmp}/dp.yaml"], "parallel.data_parallel"),
])
def test_compile_refuses_bad_flags_before_loading_the_model(flags, message, tmp_path, capsys):
    (tmp_path / "spec.py").write_text(_MARKED_SPEC)
    (tmp_path / "bad.yaml").write_text("precision: {weight_dtyp: bf16}\n")
    (tmp_path / "dp.yaml").write_text("parallel: {data_parallel: 2}\n")
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert main(["compile", f"{tmp_path}/spec.py:build", "-o", str(tmp_path / "m.dz"),
                 *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "imported").exists(), "the SPEC ran before the refusal"


def test_the_marked_spec_runs_when_the_flags_are_right(tmp_path, capsys):
    """The control of the test above: the marker does appear when the compile goes on."""
    (tmp_path / "spec.py").write_text(_MARKED_SPEC)
    assert main(["compile", f"{tmp_path}/spec.py:build", "-o", str(tmp_path / "m.dz"),
                 "--backend", "reference", "-q"]) == 0
    assert (tmp_path / "imported").read_text() == "the SPEC ran"


# -- compile --help and the config-setting flags ----------------------------------------------

def _compile_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["compile"]


def test_compile_help_explains_every_option(capsys):
    for action in _compile_parser()._actions:
        if action.option_strings and action.option_strings != ["--report=all"]:
            assert action.help and action.help.strip(), f"{action.option_strings} has no help"
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = capsys.readouterr().out
    for flag in ("-o OUT.dz, --out OUT.dz", "--backend NAME", "--config FILE.yaml",
                 "--kv-cache-memory SIZE", "--max-batch-tokens N", "--prefill-chunk N",
                 "--block-size N", "--weight-dtype", "--quantize"):
        assert re.search(rf"^  {re.escape(flag)}\s+\S", text, re.M) or \
            re.search(rf"^  {re.escape(flag)}[^\n]*\n\s{{10,}}\S", text, re.M), flag
    assert "--report=all" in text and "(config key generation.kv_cache_memory; default 2GiB)" \
        in " ".join(text.split())


@pytest.mark.parametrize("flags, message", [
    (["--block-size", "0"], "'0' is not a positive integer"),
    (["--kv-cache-memory", "lots"], "'lots' is not a size such as 2GiB"),
    (["--quantize", "int3"], "'int3' is not one of"),
])
def test_bad_setting_values_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compile", MLP, "-o", "x.dz", *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_setting_flags_override_the_config_file_key_by_key(tmp_path, capsys):
    """--weight-dtype and --quantize replace their keys of --config; the file's other keys stay
    (quantize.group_size)."""
    config = tmp_path / "c.yaml"
    config.write_text("precision: {weight_dtype: fp16}\nquantize: {weights: int8, "
                      "group_size: 32}\n")
    out = tmp_path / "m.dz"
    assert main(["compile", MLP, "-o", str(out), "--config", str(config), "--weight-dtype",
                 "bf16", "--quantize", "int4", "-q"]) == 0
    recorded = json.loads((out / "manifest.json").read_text())["config"]
    assert recorded["precision"]["weight_dtype"] == "bf16"
    assert recorded["quantize"]["weights"] == "int4" and recorded["quantize"]["group_size"] == 32


# -- compile --report: the near misses, or all of them -----------------------------------------

def test_report_shows_the_patterns_that_matched_partly(tmp_path, capsys):
    """tests/passes/near_miss_model.py: attention and a tanh GELU nearly fire, and a dozen
    patterns (norms, MoE, rotary, ...) stop at their first node. --report shows the two with a
    count of the rest; --report=all (even before the SPEC) lists every pattern tried."""
    assert main(["compile", NEAR_MISSES, "-o", str(tmp_path / "a.dz"), "--report", "-q"]) == 0
    near = capsys.readouterr().out
    missed = near.split("nearest misses first):\n")[1].split("\nop counts")[0].split("\n")
    rules = [line.split()[0] for line in missed if re.match(r"  \w", line)]
    assert rules[:2] == ["attention", "gelu_tanh"]
    left_out = re.search(r"^patterns tried that did not fire and matched nothing past their "
                         r"first node: (\d+) \(--report=all lists them\)$", near, re.M)
    assert left_out and int(left_out.group(1)) >= 5
    assert main(["compile", "--report=all", NEAR_MISSES, "-o", str(tmp_path / "b.dz"),
                 "-q"]) == 0
    everything = capsys.readouterr().out
    listed = re.findall(r"^  (\w+) +\d+ node\(s\)$", everything, re.M)
    assert set(rules) < set(listed) and len(listed) == len(rules) + int(left_out.group(1))
    assert "matched nothing past their first node" not in everything


# -- a checkpoint whose tokenizer is short of the model's vocabulary --------------------------

@pytest.fixture(scope="module")
def short_tokenizer_compile(tmp_path_factory):
    """The tiny Llama checkpoint (vocabulary 256) with its tokenizer cut to 100 ids, compiled
    with generation settings on the command line over a config file: (stderr, artifact)."""
    import contextlib
    import io

    from tests.generation.tiny_lms import checkpoint_folder

    root = tmp_path_factory.mktemp("short")
    checkpoint_folder(root / "ckpt")
    tokenizer = json.loads((root / "ckpt" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = {t: i for t, i in vocab.items() if i < 100}
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] < 100]
    (root / "ckpt" / "tokenizer.json").write_text(json.dumps(tokenizer))
    (root / "gen.yaml").write_text("generation: {kv_cache_memory: 1GiB, block_size: 32, "
                                   "prefill_chunk: 128}\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["compile", str(root / "ckpt"), "-o", str(root / "lm.dz"), "--seq-len",
                       "2:64", "--config", str(root / "gen.yaml"), "--kv-cache-memory", "8MiB",
                       "--block-size", "8", "--max-batch-tokens", "48"])
    assert status == 0, err.getvalue()
    return err.getvalue(), root / "lm.dz"


def test_a_tokenizer_short_of_the_vocabulary_is_warned_of(short_tokenizer_compile):
    err, _ = short_tokenizer_compile
    assert re.search(r"^  warning: the tokenizer \(.*tokenizer\.json\) has 100 tokens but the "
                     r"model's vocabulary has 256: generated ids 100 to 255 decode to no text",
                     err, re.M)
    assert err.index("warning:") < err.index("[export]")  # said before the long part


def test_generation_flags_override_the_config(short_tokenizer_compile):
    _, artifact = short_tokenizer_compile
    section = json.loads((artifact / "manifest.json").read_text())["generation"]
    assert (section["kv_cache_memory"], section["block_size"], section["max_batch_tokens"]) == \
        (8 << 20, 8, 48)
    assert section["prefill_chunk"] == 128  # the file's, no flag given


def test_tokenizer_size_counts_ids_of_each_model_kind(tmp_path):
    from compiler.generation import tokenizer_size, tokenizer_vocabulary_warning

    cases = {"bpe": ({"model": {"vocab": {"a": 0, "b": 7}}, "added_tokens": [{"id": 9}]}, 10),
             "unigram": ({"model": {"vocab": [["a", 0.0], ["b", -1.0]]}}, 2),
             "broken": ({"model": {}}, None)}
    for name, (data, size) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        assert tokenizer_size(path) == size, name
    (tmp_path / "tokenizer.json").write_text(json.dumps(cases["bpe"][0]))

    class Config:
        vocab_size = 10

    class Model:
        config = Config()

    assert tokenizer_vocabulary_warning(tmp_path, Model()) is None
    Config.vocab_size = 12
    assert "has 10 tokens but the model's vocabulary has 12" in \
        tokenizer_vocabulary_warning(tmp_path, Model())
