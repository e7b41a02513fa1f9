"""The partitioned artifact on disk, and its rank programs run in-process (threads, no launch).

Per rank: one graph, its own weight shards (data-parallel replicas share their twin's files),
one backend payload per compute segment; `dayzero inspect` shows the communication report.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from compiler.cli import main
from compiler.config import load_config
from compiler.driver import _backend, lower_and_write
from compiler.errors import ArtifactError, DayzeroError
from compiler.log import SILENT
from runtime.artifact import open_artifact
from runtime.rank_exec import RankExecutor
from tests.passes.parallel_util import llama_graph, run_ranks


def _compile(path, parallel, backend="reference", batch=1):
    graph, ids, expected = llama_graph(batch)
    lower_and_write(graph, path, _backend(backend), load_config({"parallel": parallel}),
                    passes="", dump_ir=None, force=False, log=SILENT)
    return ids.numpy(), expected.numpy()


def _run_in_threads(path, ids):
    """Every rank's program on its own thread, communicating through shared memory."""
    manifest = json.loads((path / "manifest.json").read_text())
    world = manifest["parallel"]["world_size"]

    def rank_fn(rank):
        program = RankExecutor(open_artifact(path, rank=rank), rank)
        return program([ids], {"s0": ids.shape[1]})

    return manifest, run_ranks(world, rank_fn)


def test_data_and_tensor_parallel_layout_on_disk(tmp_path):
    path = tmp_path / "dp2tp2.dz"
    ids, expected = _compile(path, {"data_parallel": 2, "tensor_parallel": 2}, batch=2)
    manifest, outputs = _run_in_threads(path, ids)
    par = manifest["parallel"]
    assert (par["world_size"], par["data_parallel"], par["tensor_parallel"]) == (4, 2, 2)
    assert par["groups"] == {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}
    entries = {r["rank"]: r for r in par["ranks"]}
    assert [entries[r]["graph"] for r in range(4)] == [f"graphs/rank-{r}.dzir" for r in range(4)]
    assert entries[0]["weights"] == ["weights/rank-0/model-00001-of-00001.safetensors"]
    assert entries[2]["weights"] == entries[0]["weights"]  # the dp replica shares the shards
    assert entries[3]["weights"] == entries[1]["weights"]
    assert not (path / "weights" / "rank-2").exists()
    assert entries[1]["coords"] == {"dp": 0, "pp": 0, "tp": 1}
    shards = open_artifact(path, rank=1).weights()
    assert shards["model.model.layers.0.self_attn.q_proj.weight"].shape == (32, 64)
    assert "inputs" in manifest and manifest["outputs"][0]["name"] == "out"
    for (logits,) in outputs:
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_onnxruntime_runs_each_compute_segment(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "ort.dz"
    ids, expected = _compile(path, {"tensor_parallel": 2, "pipeline_parallel": 2},
                             backend="onnxruntime")
    manifest, outputs = _run_in_threads(path, ids)
    for entry in manifest["parallel"]["ranks"]:
        segments = entry["segments"]
        assert segments >= 2
        for k in range(segments):
            assert f"backend/rank-{entry['rank']}/seg-{k}/model.onnx" in manifest["files"]
    assert outputs[0] == [] and outputs[1] == []
    for logits in (outputs[2][0], outputs[3][0]):
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_a_rank_reads_only_its_own_weight_files(tmp_path):
    path = tmp_path / "tp2.dz"
    _compile(path, {"tensor_parallel": 2})
    shard = next((path / "weights" / "rank-0").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-4] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="rank-0/.* does not match its sha256"):
        open_artifact(path)
    assert open_artifact(path, rank=1).weights()  # rank 1 never reads rank 0's file
    with pytest.raises(ArtifactError, match="rank-0"):
        open_artifact(path, rank=0)


def test_a_single_rank_artifact_keeps_its_layout(tmp_path):
    path = tmp_path / "one.dz"
    _compile(path, {})
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["parallel"]["world_size"] == 1
    assert manifest["parallel"]["ranks"] == [
        {"rank": 0, "graph": "graph.dzir",
         "weights": ["weights/model-00001-of-00001.safetensors"]}]
    assert not (path / "graphs").exists()


def test_impossible_config_names_the_key_and_numbers(tmp_path):
    with pytest.raises(DayzeroError, match=r"'parallel.tensor_parallel' = 3 does not divide the "
                                           r"4 attention heads"):
        _compile(tmp_path / "bad.dz", {"tensor_parallel": 3})
    with pytest.raises(DayzeroError, match=r"'parallel.data_parallel' = 2 does not divide the "
                                           r"batch size 1"):
        _compile(tmp_path / "bad.dz", {"data_parallel": 2})
    assert not (tmp_path / "bad.dz").exists()


def test_inspect_prints_stages_and_the_communication_report(tmp_path, capsys):
    path = tmp_path / "tp2pp2.dz"
    _compile(path, {"tensor_parallel": 2, "pipeline_parallel": 2})
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# parallel: world size 4 = data 1 x pipeline 2 x tensor 2" in out
    assert "# stage imbalance:" in out
    assert "# rank 0: 7 collectives" in out and "# rank 2: 7 collectives" in out
    assert "#     all_reduce     %add_6.ar: f32[1, s0, 64] over tp [0, 1]: 256*s0 B" in out
    assert "#     all_gather     %out: f32[1, s0, 256] over tp [2, 3]: 1024*s0 B" in out
    assert "# total: 28 collectives" in out
    assert "shard(" in out  # the annotated global graph follows
    assert main(["inspect", str(path), "--rank", "3"]) == 0
    rank3 = capsys.readouterr().out
    assert "graph CausalLM_rank3 {" in rank3 and "recv()" in rank3
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["communication"]
    assert report["total"]["count"] == 28


def test_a_partitioned_artifact_with_an_edited_output_shape_is_refused_at_load(tmp_path):
    """The launcher and each rank check the manifest against the graph (issue 33): an output
    shape edited in manifest.json alone is named as an inconsistent artifact at load, not a
    lowering bug after the ranks ran."""
    import runtime
    from runtime.distributed import LaunchedModel

    path = tmp_path / "tp2.dz"
    _compile(path, {"tensor_parallel": 2})
    assert isinstance(runtime.load(path), LaunchedModel)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["outputs"][0]["shape"] = [1, "2*s0", 7]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="the artifact is inconsistent"):
        runtime.load(path)
