"""benchmarks/generation_sweep.py's bookkeeping: the token comparison and its ties, how a compile
is classified (refused, crash), the child's result line, the report and the docs section; and
one architecture end to end (Llama: checkpoint folder, `dayzero compile`, generation against
transformers), the not-causal check on a BERT-style class, and the time limit."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def gs():
    with benchmark_script("generation_sweep") as module:
        yield module


def test_equal_tokens_pass_and_a_difference_is_a_mismatch(gs):
    assert gs.compare_tokens([5, 6, 7], [5, 6, 7], [0.5, 0.5, 0.5]) == ("pass", "")
    verdict, where = gs.compare_tokens([5, 9, 7], [5, 6, 7], [0.5, 0.01, 0.5])
    assert verdict == "mismatch" and where.startswith("new token 1: dayzero 9, transformers 6")


def test_a_first_difference_within_the_tie_margin_is_a_tie(gs):
    # transformers' top-2 were 5e-5 apart at step 1: either token is greedy's choice
    verdict, where = gs.compare_tokens([5, 9, 1, 2], [5, 6, 7, 8], [0.5, 5e-5, 0.5, 0.5])
    assert verdict == "tie" and where.startswith("tie at new token 1")
    assert gs.compare_tokens([5, 9], [5, 6], [0.5, 1e-4])[0] == "tie"  # within: inclusive
    assert gs.compare_tokens([5, 9], [5, 6], [0.5, 1.1e-4])[0] == "mismatch"
    assert gs.compare_tokens([5, 9], [5, 6], [0.5, float("nan")])[0] == "mismatch"
    # only the FIRST difference may be a tie: a close step after it does not excuse it
    assert gs.compare_tokens([4, 9], [5, 6], [0.5, 0.0])[0] == "mismatch"


def test_one_side_stopping_at_eos_early_is_a_mismatch(gs):
    # transformers stopped at its eos (2) after two tokens; dayzero generated on
    verdict, where = gs.compare_tokens([5, 2, 7], [5, 2], [0.5, 0.5])
    assert verdict == "mismatch" and where.startswith("new token 2: dayzero 7, transformers "
                                                      "stopped")
    assert gs.compare_tokens([5], [5, 2], [0.5, 1e-9])[0] == "mismatch"  # no token is no tie


def test_a_token_transformers_forced_says_so(gs):
    # forced_eos_token_id: every score but eos's is -inf at the last step, the gap infinite
    assert gs.compare_tokens([5, 7], [5, 2], [0.5, float("inf")]) == (
        "mismatch", "new token 1: dayzero 7, transformers 2 (a logit processor forced it)")


def test_a_compile_is_refused_cleanly_or_crashes(gs):
    assert gs.classify_compile(0, "anything") is None
    refused = "load ...\nerror: attention node %sdpa was not recognised\n  where: x\n  fix: y\n"
    assert gs.classify_compile(1, refused) == ("refused",
                                               "attention node %sdpa was not recognised")
    internal = "internal error: KeyError: 'x'\n  fix: rerun with --debug"
    assert gs.classify_compile(1, internal) == ("crash", "KeyError: 'x'")
    assert gs.classify_compile(-9, "Killed\n") == ("crash", "compile died (signal 9): Killed")
    traceback = "Traceback (most recent call last):\n  File x\nValueError: bad\n"
    assert gs.classify_compile(1, traceback) == ("crash",
                                                 "compile died (exit status 1): ValueError: bad")


def test_the_childs_result_line_or_how_it_died(gs):
    arch = gs.Arch("causal-lm", "llama", "LlamaForCausalLM")
    line = gs.RESULT_TAG + json.dumps({"arch": "causal-lm/llama", "cls": "LlamaForCausalLM",
                                       "outcome": "refused", "cause": "c", "seconds": 1.0})
    got = gs.parse_result(arch, 0, f"noise\n{line}\n", "", 7.5)
    assert (got.outcome, got.cause, got.seconds) == ("refused", "c", 7.5)
    died = gs.parse_result(arch, -11, "", "Traceback\nSegfault here\n", 2.0)
    assert (died.outcome, died.cause) == ("crash", "process died (signal 11): Segfault here")


def _results(gs):
    R = gs.Result
    return [R("causal-lm/llama", "LlamaForCausalLM", "pass"),
            R("causal-lm/phi", "PhiForCausalLM", "pass", "prompt of 5: tie at new token 3"),
            R("causal-lm/glm4", "Glm4ForCausalLM", "refused",
              "attention node %sdpa_3 at a.py:12 was not recognised"),
            R("causal-lm/apertus", "ApertusForCausalLM", "refused",
              "attention node %sdpa_1 at b.py:40 was not recognised"),
            R("causal-lm/git", "GitForCausalLM", "mismatch", "new token 0 | x"),
            R("causal-lm/odd", "OddForCausalLM", "crash", "KeyError: 'x'"),
            R("causal-lm/mpt", "MptForCausalLM", "refused",
              "torch.export could not trace MptForCausalLM: Constraints violated (seq)!"),
            R("causal-lm/mamba", "MambaForCausalLM", "refused",
              "torch.export could not trace MambaForCausalLM: Constraints violated (seq)!"),
            R("causal-lm/bert", "BertLMHeadModel", "not causal", "dayzero refused: ..."),
            R("causal-lm/broken", "BrokenForCausalLM", "skip", "build: TypeError: no")]


def test_totals_count_skips_and_non_causal_apart(gs):
    text = gs.summary(_results(gs))
    assert text == ("10 architectures: 2 pass, 1 mismatch, 4 refused, 1 crash, 0 timeout, "
                    "1 skip, 1 not causal; pass 2 of 8 (25.0%)")
    groups = gs.refusals_by_cause(_results(gs))
    # the same cause at another node and source line, or in another class, is one group
    assert groups == [("refused: attention node _ at _ was not recognised", ["glm4", "apertus"]),
                      ("refused: torch.export could not trace _: Constraints violated (seq)!",
                       ["mpt", "mamba"]),
                      ("crash: KeyError: _", ["odd"])]


def test_the_markdown_section_has_the_command_totals_and_a_row_each(gs):
    text = gs.markdown(_results(gs), "python benchmarks/generation_sweep.py --only llama")
    assert text.startswith("## The generation sweep\n")
    assert "`python benchmarks/generation_sweep.py --only llama` on " in text
    assert "CPU cores" in text and "pass 2 of 8 (25.0%)" in text
    assert "| git | GitForCausalLM | mismatch | new token 0 / x |" in text  # no stray column
    assert text.count("\n| ") == 11  # the header and ten rows


def test_a_bert_style_class_without_is_decoder_is_not_causal(gs, tmp_path):
    arch = gs.Arch("causal-lm", "bert", "BertLMHeadModel")
    gs.build_checkpoint(arch, tmp_path / "ckpt")
    with pytest.raises(gs.NotCausal, match="not causal as configured"):
        gs.reference(arch, tmp_path / "ckpt")


def test_llama_end_to_end_passes_and_a_wrong_token_is_a_mismatch(gs, tmp_path):
    """In this process but for `dayzero compile` (the sweep's child does the same steps)."""
    arch = gs.Arch("causal-lm", "llama", "LlamaForCausalLM")
    got = gs.check_architecture(arch, tmp_path, timeout=120)
    assert (got.outcome, got.cause) == ("pass", "")
    ref = json.loads((tmp_path / "llama" / "reference.json").read_text())
    assert [len(r["prompt"]) for r in ref["runs"]] == list(gs.PROMPT_LENGTHS)
    assert all(len(r["tokens"]) == len(r["gaps"]) <= gs.NEW_TOKENS for r in ref["runs"])
    # the same artifact against a reference with one token changed (a decided step)
    run = ref["runs"][1]
    step = next(i for i, gap in enumerate(run["gaps"]) if gap > 1e-3)
    run["tokens"][step] = (run["tokens"][step] + 1) % 512
    outcome, cause = gs.run_artifact(tmp_path / "llama" / "model.dz", ref)
    assert outcome == "mismatch" and cause.startswith(f"prompt of 11: new token {step}: ")


def test_a_child_over_its_time_limit_is_a_timeout_or_transformers_skip(gs, tmp_path):
    arch = gs.Arch("causal-lm", "llama", "LlamaForCausalLM")
    # killed before transformers' reference was written: not dayzero's time
    got = gs.run_isolated(arch, tmp_path, timeout=0.05, memory_gib=8)
    assert (got.outcome, got.cause) == ("skip", "transformers: over 0.05 s")
    (tmp_path / "llama").mkdir(exist_ok=True)
    (tmp_path / "llama" / "reference.json").write_text('{"runs": []}')
    got = gs.run_isolated(arch, tmp_path, timeout=0.05, memory_gib=8)
    assert (got.outcome, got.cause) == ("timeout", "over 0.05 s")
