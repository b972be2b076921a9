"""Our batched, windowed Qwen3-ASR audio encoder and the lean prefill (issue 50), on the
tiny checkpoint through the SDK's real model classes, in float32.

The encoder must equal the checkpoint's windowed reference: the SDK's own encoder forward
with its own 8 s window mask (`_prepare_attention_mask`, what its flash-attention path
computes) and, where a window holds whole 1 s chunks, that window run alone. The audio
attention of the fixture is made sharp (q and k weights scaled), so that attention across
windows would move the outputs well past the tolerance: the test of the SDK's unwindowed
SDPA forward shows it does."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from qwen3_asr_server.engines.base import TranscribeRequest
from qwen3_asr_server.engines.qwen.encoder import AudioEncoder, tokens_for
from qwen3_asr_server.engines.qwen.engine import QwenEngine
from qwen3_asr_server.engines.qwen.prefill import Prompts
from qwen3_asr_server.engines.qwen.rows import Row, prompt_for
from speech import sentences
from streaming_client import load

TOLERANCE = 1e-4
SHARPEN = 8.0  # q and k weights scaled: attention logits x64
LOUDER = 10.0  # v and out weights scaled: attention's share of each layer's output
OUTPUT = 100.0  # the last projection scaled: outputs of order 1 (random weights give 0.01)
LENGTHS = [30, 99, 100, 250, 800, 850, 1700, 2000, 2999]  # log-mel frames (10 ms each)


@pytest.fixture(scope="module")
def tower(tiny_qwen_dir: Path) -> Any:
    """The tiny checkpoint's audio encoder, with sharp, loud attention."""
    import qwen_asr  # noqa: F401  (registers the model classes with transformers)
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        str(tiny_qwen_dir), dtype=torch.float32, attn_implementation="sdpa"
    )
    audio = model.thinker.audio_tower.eval()
    with torch.no_grad():
        for layer in audio.layers:
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
            layer.self_attn.k_proj.weight.mul_(SHARPEN)
            layer.self_attn.v_proj.weight.mul_(LOUDER)
            layer.self_attn.out_proj.weight.mul_(LOUDER)
        audio.proj2.weight.mul_(OUTPUT)
    return audio


def sdk(tower: Any, features: Any, windowed: bool = True) -> Any:
    """The SDK's forward of one row; with its own window mask passed to every layer."""
    hooks = []
    if windowed:

        def with_mask(module: Any, args: Any, kwargs: Any) -> Any:
            hidden, cu_seqlens = args[0], args[1]
            mask = tower._prepare_attention_mask(hidden, cu_seqlens)
            return args, {**kwargs, "attention_mask": mask}

        hooks = [
            layer.register_forward_pre_hook(with_mask, with_kwargs=True) for layer in tower.layers
        ]
    try:
        with torch.no_grad():
            return tower(features, feature_lens=torch.tensor([features.shape[1]])).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()


def features(lengths: list[int], seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(len(lengths), 128, max(lengths), generator=generator)


@pytest.mark.parametrize("buckets", [False, True])
def test_a_batch_equals_the_windowed_reference_row_by_row(tower: Any, buckets: bool) -> None:
    feats = features(LENGTHS)
    with torch.no_grad():
        ours = AudioEncoder(tower, gpu=buckets)(feats, LENGTHS)
    reference = torch.cat([sdk(tower, feats[i, :, :n]) for i, n in enumerate(LENGTHS)])
    assert ours.shape == reference.shape
    assert ours.shape[0] == sum(tokens_for(n) for n in LENGTHS)
    assert float((ours - reference).abs().max()) < TOLERANCE


def test_the_sharp_fixture_tells_windows_from_none(tower: Any) -> None:
    """The SDK's SDPA forward (no windows) is off the reference by far more than the
    tolerance here: the tests above could fail. (A short last window shows it most: alone
    it attends to a few positions, unwindowed to 8 s more.)"""
    feats = features([850])[0]
    gap = (sdk(tower, feats, windowed=False) - sdk(tower, feats)).abs().max()
    assert float(gap) > 10 * TOLERANCE


def test_each_whole_window_equals_that_window_run_alone(tower: Any) -> None:
    length = 2400  # three windows of 8 whole chunks
    feats = features([length])
    with torch.no_grad():
        ours = AudioEncoder(tower)(feats, [length])
    alone = torch.cat([sdk(tower, feats[0, :, w : w + 800]) for w in range(0, length, 800)])
    assert float((ours - alone).abs().max()) < TOLERANCE


def test_a_window_does_not_change_when_another_windows_audio_does(tower: Any) -> None:
    encoder = AudioEncoder(tower)
    first = features([1750], seed=1)  # windows of 8 s, 8 s and 0.5 s
    second = first.clone()
    second[0, :, :800] = 4.0 - 8.0 * first[0, :, :800]  # another sound altogether
    with torch.no_grad():
        a, b = encoder(first, [1750]), encoder(second, [1750])
    window = encoder.window  # the first window's tokens
    assert float((a[:window] - b[:window]).abs().max()) > TOLERANCE  # it changed
    assert torch.equal(a[window:], b[window:])  # the others did not
    sdk_first, sdk_second = sdk(tower, first[0], False), sdk(tower, second[0], False)
    assert float((sdk_first[window:] - sdk_second[window:]).abs().max()) > TOLERANCE


def test_batch_partners_change_no_row(tower: Any) -> None:
    """A row under 1 s is not padded by the SDK alone; in a batch, its padding is masked."""
    lengths = [60, 1300, 45]
    feats = features(lengths, seed=3)
    encoder = AudioEncoder(tower)
    with torch.no_grad():
        together = encoder(feats, lengths)
        alone = [encoder(feats[i : i + 1, :, :n], [n]) for i, n in enumerate(lengths)]
    assert float((together - torch.cat(alone)).abs().max()) < 1e-6


class Reads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host."""

    NAMES = frozenset(
        {"item", "tolist", "__bool__", "nonzero", "__index__", "__int__", "__float__"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in self.NAMES:
            self.count += 1
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


class Ops(TorchDispatchMode):
    """Counts the operators that run (what a device would launch)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir: Path) -> Iterator[QwenEngine]:
    e = QwenEngine(str(tiny_qwen_dir), device="cpu", decode="steps", rows=32, kv_tokens=512)
    e.load()
    yield e
    e.unload()


def rows(engine: QwenEngine, count: int) -> list[Row]:
    """Rows of 2 to 6 s of speech, prepared (prompts, tokens, log-mel) as the loop does."""
    clips = [load(name) for name in sorted(sentences())[:4]]
    requests = [TranscribeRequest(audio=clips[i % 4][: 16000 * (2 + i % 5)]) for i in range(count)]
    assert engine._preparer is not None
    prepared = engine._preparer([(i, r, None) for i, r in enumerate(requests)]).rows()
    assert all(isinstance(r, Row) for r in prepared), prepared
    return [r for r in prepared if isinstance(r, Row)]


def prefill(engine: QwenEngine, taken: list[Row], mode: Any) -> None:
    decoder = engine._decoder
    assert decoder is not None
    prompts = Prompts.join([r.prompts for r in taken if r.prompts is not None])
    with mode:
        decoder._fill(taken, prompts)
    decoder.leave(lambda r: True)


def test_a_prefill_of_32_rows_reads_the_device_at_most_three_times(engine: QwenEngine) -> None:
    reads = Reads()
    taken = rows(engine, 32)
    prefill(engine, taken, reads)
    assert reads.count <= 3, reads.seen
    assert all(len(row.record.generated) == 1 for row in taken)  # each chose its first


def test_a_prefill_of_32_rows_runs_few_more_operators_than_one(engine: QwenEngine) -> None:
    one, many = Ops(), Ops()
    prefill(engine, rows(engine, 1), one)
    prefill(engine, rows(engine, 32), many)
    print("operators, 1 row and 32 rows:", one.count, many.count)
    assert many.count <= 1.5 * one.count, (one.count, many.count)


def test_the_lean_prefill_chooses_what_the_models_own_forward_does(engine: QwenEngine) -> None:
    """The first token of each row, from our prefill of 6 rows of different lengths, is the
    argmax of the model's own forward (the thinker, on that row alone)."""
    taken = rows(engine, 6)
    prefill(engine, taken, contextlib.nullcontext())
    assert engine._model is not None
    processor, thinker = engine._model.processor, engine._model.model.thinker
    for row in taken:
        prompt, _ = prompt_for(engine._model, row.request)
        inputs = processor(text=[prompt], audio=[row.request.audio], return_tensors="pt")
        with torch.no_grad():
            logits = thinker(**inputs).logits[0, -1]
        assert row.record.generated[0] == int(np.argmax(logits.numpy()))


def test_the_warm_up_leaves_no_row_and_changes_no_answer(engine: QwenEngine) -> None:
    """(It runs at load on CUDA only; here its prefills of every bucket run on CPU.)"""
    decoder = engine._decoder
    assert decoder is not None
    request = TranscribeRequest(audio=load(sorted(sentences())[0]))
    before = engine.transcribe(request)
    decoder.warm(seconds=(2,))
    assert decoder.rows == [] and decoder.free == decoder.slots
    after = engine.transcribe(request)
    assert (after.text, after.usage) == (before.text, before.usage)


def test_kv_buckets_cover_every_length_and_end_at_the_cache() -> None:
    from qwen3_asr_server.engines.qwen.steps import kv_bucket, kv_buckets

    assert kv_buckets(1024) == [256, 512, 1024]
    assert kv_buckets(2400) == [256, 512, 1024, 2048, 2400]
    assert kv_buckets(200) == [200]
    assert [kv_bucket(n, 2400) for n in (1, 256, 257, 2047, 2049, 2400)] == [
        256, 256, 512, 2048, 2400, 2400
    ]  # fmt: skip


def window_independent(thinker: Any) -> bool:
    """The thinker's own `get_audio_features`: is the last window's output untouched when
    only the first window's audio changes? (Unwindowed attention moves it, if only in the
    last bits with random weights.)"""
    first = features([1750], seed=5)
    second = first.clone()
    second[0, :, :800] = 4.0 - 8.0 * first[0, :, :800]
    mask = torch.ones(1, 1750, dtype=torch.long)
    with torch.no_grad():
        a = thinker.get_audio_features(first, feature_attention_mask=mask)
        b = thinker.get_audio_features(second, feature_attention_mask=mask)
    window = AudioEncoder(thinker.audio_tower).window
    return bool(torch.equal(a[2 * window :], b[2 * window :]))


def test_generate_and_the_aligner_use_the_windowed_encoder(
    tiny_qwen_dir: Path, tiny_aligner_dir: Path
) -> None:
    from qwen3_asr_server.engines.qwen.load import load_aligner

    generate = QwenEngine(str(tiny_qwen_dir), device="cpu", decode="generate")
    generate.load()
    try:
        assert generate._model is not None
        thinker = generate._model.model.thinker
        assert window_independent(thinker)
        del thinker.get_audio_features  # the SDK's own encoder: attends across windows
        assert not window_independent(thinker)
    finally:
        generate.unload()
    kwargs = {"dtype": torch.float32, "device_map": "cpu", "attn_implementation": "sdpa"}
    aligner = load_aligner(str(tiny_aligner_dir), kwargs)
    assert window_independent(aligner.model.thinker)


def test_preparer_threads_run_torch_on_one_core_and_leave_the_callers_alone(
    engine: QwenEngine,
) -> None:
    """Each preparer thread bringing its own OpenMP team made a decode step of 8 rows 4x
    slower on 2 cores; the preparer's threads run torch on one thread, ours keeps its own."""
    before = torch.get_num_threads()
    rows(engine, 2)  # runs the log-mel on the preparer's thread
    assert engine._preparer is not None
    assert engine._preparer.pool.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == before
    fresh: list[int] = []  # a thread that starts torch later (the inference thread may)
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert fresh == [before]
