"""An image-text checkpoint folder (tiny LLaVA: CLIP vision tower, projector, Llama) compiled by
`dayzero compile FOLDER` into one generation artifact, whose greedy output with an image is
token-for-token transformers' LlavaForConditionalGeneration.generate, text-only requests
unchanged, image and text requests sharing a batch, the encoder run once per image."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

import runtime
from compiler.errors import InputError
from tests.generation.tiny_llava import (
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    compile_folder,
    expanded_ids,
    image_bytes,
    image_processor,
)

NEW = 24


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    artifact, hf = compile_folder(root)
    return artifact, hf, root / "ckpt"


def _pixels(data: bytes) -> torch.Tensor:
    from PIL import Image

    return image_processor()(Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"]


def _hf_new(hf, ids: list[int], pixels=None, new: int = NEW) -> list[int]:
    tensor = torch.tensor([ids])
    extra = {} if pixels is None else {"pixel_values": pixels}  # None would run the tower
    with torch.no_grad():
        out = hf.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new,
                          do_sample=False, pad_token_id=0, **extra)
    return out[0, len(ids):].tolist()


def _prompt(words: int = 3) -> list[int]:
    return [1, *range(3, 3 + words), *[IMAGE_TOKEN_ID] * IMAGE_TOKENS, 7, 8]


def test_one_artifact_holds_the_encoder_and_the_step(compiled):
    artifact, _, _ = compiled
    manifest = json.loads((artifact / "manifest.json").read_text())
    vision = manifest["generation"]["vision"]
    assert {k: vision[k] for k in ("artifact", "image_token_id", "image_tokens",
                                   "hidden_size")} == {
        "artifact": "vision", "image_token_id": IMAGE_TOKEN_ID, "image_tokens": IMAGE_TOKENS,
        "hidden_size": 64}
    assert vision["processor"]["crop_size"] == {"height": 32, "width": 32}
    assert "vision/manifest.json" in manifest["files"]  # hashed like every file
    inputs = {i["name"]: i for i in manifest["inputs"]}
    assert inputs["image_embeds"]["shape"] == [1, "s0", 64]
    assert inputs["image_mask"]["dtype"] == "bool"
    inner = json.loads((artifact / "vision" / "manifest.json").read_text())
    assert [i["shape"] for i in inner["inputs"]] == [[1, 3, 32, 32]]
    assert [o["shape"] for o in inner["outputs"]] == [[1, IMAGE_TOKENS, 64]]


def test_greedy_with_an_image_is_transformers_token_for_token(compiled):
    artifact, hf, _ = compiled
    model = runtime.load(artifact)
    for fmt, seed in (("PNG", 0), ("JPEG", 1)):
        data = image_bytes(fmt, seed=seed)
        ids = _prompt()
        want = _hf_new(hf, ids, _pixels(data))
        assert want != _hf_new(hf, ids, _pixels(image_bytes(fmt, seed=seed + 5)))  # it matters
        out = model.generate([ids], max_new_tokens=NEW, images=[data])
        assert out[0, len(ids):].tolist() == want
        out = model.generate([ids], max_new_tokens=NEW, pixel_values=_pixels(data).numpy())
        assert out[0, len(ids):].tolist() == want


def test_generate_text_with_openai_image_parts(compiled):
    import base64

    artifact, hf, folder = compiled
    model = runtime.load(artifact)
    data = image_bytes("JPEG", seed=3)
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "hello world"},
        {"type": "image_url", "image_url": {"url": url}}]}]
    ids = expanded_ids([{"role": "user", "content": [{"type": "text", "text": "hello world"},
                                                     {"type": "image"}]}], folder)
    assert ids.count(IMAGE_TOKEN_ID) == IMAGE_TOKENS
    from transformers import AutoTokenizer

    want = AutoTokenizer.from_pretrained(folder).decode(_hf_new(hf, ids, _pixels(data), 12),
                                                       skip_special_tokens=True)
    assert model.generate_text(messages, max_new_tokens=12) == want


def test_text_only_requests_are_unaffected_and_share_the_batch(compiled):
    artifact, hf, _ = compiled
    model = runtime.load(artifact)
    text = [1, 3, 4, 5, 6, 9]
    data = image_bytes("PNG", seed=2)
    alone_text = _hf_new(hf, text)
    alone_image = _hf_new(hf, _prompt(4), _pixels(data))
    assert model.generate([text], max_new_tokens=NEW)[0, len(text):].tolist() == alone_text
    # one call, one batch: the image prompt and the text prompt in the same steps
    out = model.generate([text, _prompt(4)], max_new_tokens=NEW, images=[data])
    width = max(len(text), len(_prompt(4)))
    assert out[0, width:].tolist() == alone_text
    assert out[1, width:].tolist() == alone_image
    # the prefill forward of a text prompt is transformers' logits
    with torch.no_grad():
        want = hf(torch.tensor([text])).logits.numpy()
    np.testing.assert_allclose(model(np.asarray([text]))[0], want, rtol=1e-4, atol=1e-4)


def test_the_encoder_runs_once_per_image_even_when_preempted(compiled):
    artifact, hf, _ = compiled
    # a cache of 5 blocks of 16: two image prompts (21 and 24 tokens) cannot both grow by 24
    model = runtime.load(artifact, kv_cache_memory=5 * model_block_bytes(artifact))
    calls = []
    encoder = model.vision.model
    model.vision._model = lambda pixels: calls.append(1) or encoder(pixels)
    images = [image_bytes("PNG", seed=7), image_bytes("JPEG", seed=8)]
    prompts = [_prompt(2), _prompt(5)]
    out = model.generate(prompts, max_new_tokens=NEW, images=images)
    assert len(calls) == 2 and model.stats.preemptions > 0
    width = max(map(len, prompts))
    for row, (ids, data) in enumerate(zip(prompts, images)):
        assert out[row, width:].tolist() == _hf_new(hf, ids, _pixels(data))


def model_block_bytes(artifact) -> int:
    return runtime.load(artifact).runner.layout.block_bytes


def test_an_image_request_is_counted_whole_before_any_work(compiled):
    artifact, _, _ = compiled
    model = runtime.load(artifact, kv_cache_memory=2 * model_block_bytes(artifact))
    calls = []
    model.vision._model = lambda pixels: calls.append(1)
    # 22 expanded tokens + 11 new need 3 blocks of 16; the cache has 2 (6 prompt tokens
    # would fit: the image's 16 tokens are counted)
    assert len(_prompt()) == 22
    with pytest.raises(InputError, match="less than one sequence of 33"):
        model.generate([_prompt()], max_new_tokens=11, images=[image_bytes()])
    assert calls == []


def test_image_token_and_image_counts_must_agree(compiled):
    artifact, _, _ = compiled
    model = runtime.load(artifact)
    with pytest.raises(InputError, match="hold 16 image tokens .* but 2 image"):
        model.generate([_prompt()], max_new_tokens=2, images=[image_bytes(), image_bytes()])
    with pytest.raises(InputError, match="not float pixel values"):
        model.generate([_prompt()], max_new_tokens=2, pixel_values=np.zeros((1, 3, 8, 8)))


def test_an_image_on_a_text_only_model_names_the_part(compiled):
    # a text-only artifact is one without `generation.vision` (the serving tests run a real
    # one); the same artifact with its encoder taken away saves a second compile here
    artifact, _, _ = compiled
    model = runtime.load(artifact)
    model.vision = None
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(InputError, match="text-only") as info:
        model.generate_text(messages, max_new_tokens=2)
    assert info.value.where == "messages[0].content[1].image_url"
    with pytest.raises(InputError, match="text-only"):
        model.generate([[1, 3]], max_new_tokens=2, images=[image_bytes()])


def test_the_prefill_forward_takes_image_rows_as_exported(compiled):
    artifact, hf, _ = compiled
    model = runtime.load(artifact)
    assert [s.name for s in model.input_specs] == ["input_ids", "image_embeds", "image_mask"]
    ids = torch.tensor([_prompt()])
    pixels = _pixels(image_bytes("PNG", seed=4))
    with torch.no_grad():
        want = hf(input_ids=ids, pixel_values=pixels).logits.numpy()
        features = hf.get_image_features(pixel_values=pixels, vision_feature_layer=-2,
                                         vision_feature_select_strategy="default",
                                         return_dict=True).pooler_output[0].numpy()
    mask = ids.numpy() == IMAGE_TOKEN_ID
    rows = np.zeros((*ids.shape, 64), np.float32)
    rows[mask] = features
    got = model(ids.numpy(), rows, mask)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_prompt_chunks_that_split_the_image_tokens(compiled):
    # prefill chunks of 5 tokens cut the 16 image tokens in four places: each chunk feeds the
    # rows of its own image tokens
    from runtime.generation.scheduler import Scheduler, Sequence

    artifact, hf, _ = compiled
    model = runtime.load(artifact)
    data = image_bytes("PNG", seed=9)
    ids = _prompt(3)
    rows = model.vision.place([ids], model.vision.features([data]))[0]
    scheduler = Scheduler(model.runner, max_batch_tokens=8, prefill_chunk=5)
    seq = Sequence(list(ids), NEW, images=rows)
    scheduler.add(seq)
    for _ in scheduler.run():
        pass
    assert seq.generated == _hf_new(hf, ids, _pixels(data))
