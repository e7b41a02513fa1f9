"""parallel.world_size decides how many processes a launch starts: it is never trusted alone."""

from __future__ import annotations

import json

import pytest

import runtime
from compiler.errors import ArtifactError
from compiler.writer import write_artifact
from runtime.distributed import MAX_WORLD_SIZE, world_size


def manifest(ranks, size):
    return {"parallel": {"world_size": size,
                         "ranks": [{"rank": r, "graph": "g", "weights": []} for r in ranks]}}


@pytest.mark.parametrize("size, message", [
    (4, r"parallel.world_size is 4 but the artifact lists ranks \[0\]"),
    (10**30, r"parallel.world_size is 10{30}, not a whole number in \[1, 65536\]"),
    ("abc", r"parallel.world_size is 'abc', not a whole number"),
    (0, "parallel.world_size is 0, not a whole number"),
    (True, "parallel.world_size is True, not a whole number"),
    (2.0, "parallel.world_size is 2.0, not a whole number"),
])
def test_a_world_size_that_does_not_match_the_ranks_is_refused(size, message):
    with pytest.raises(ArtifactError, match=message) as info:
        world_size(manifest([0], size))
    assert info.value.where == "manifest.json: parallel.world_size"


def test_ranks_must_be_0_to_world_size():
    assert world_size(manifest([1, 0], 2)) == 2
    with pytest.raises(ArtifactError, match=r"is 2 but the artifact lists ranks \[0, 0\]"):
        world_size(manifest([0, 0], 2))
    with pytest.raises(ArtifactError, match=r"is 3 but the artifact lists ranks \[0, 1\]"):
        world_size(manifest([0, 1], 3))
    with pytest.raises(ArtifactError, match="parallel.ranks is not a list of rank entries"):
        world_size({"parallel": {"world_size": 1, "ranks": [{"rank": "0"}]}})
    assert MAX_WORLD_SIZE >= 4096


@pytest.mark.parametrize("size", [4, 10**30, "abc"])
def test_load_refuses_an_edited_world_size(tmp_path, make_mlp, size):
    out = write_artifact(tmp_path / "m.dz", make_mlp(), "reference")
    data = json.loads((out / "manifest.json").read_text())
    data["parallel"]["world_size"] = size
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="parallel.world_size is"):
        runtime.load(out)
