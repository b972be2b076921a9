"""What this machine offers an engine (`qwen3-asr-server check`): torch, CUDA, CTranslate2.
Imports them, so only the check command calls it, never the server."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.choice import installed


@dataclass
class Machine:
    torch: str | None = None  # version, None when not installed
    cuda: bool = False  # torch sees a CUDA device
    torch_cuda: str | None = None  # the CUDA version torch was built for
    gpus: list[str] = field(default_factory=list)
    bf16: bool = False
    gpu_free_mb: float = 0.0
    ctranslate2_cuda: int = 0  # CUDA devices CTranslate2 (faster-whisper) sees


def probe() -> Machine:
    machine = Machine()
    if installed("torch"):
        import torch

        machine.torch = str(torch.__version__)
        machine.torch_cuda = torch.version.cuda
        machine.cuda = bool(torch.cuda.is_available())
        if machine.cuda:
            count = torch.cuda.device_count()
            machine.gpus = [torch.cuda.get_device_name(i) for i in range(count)]
            machine.bf16 = bool(torch.cuda.is_bf16_supported())
            machine.gpu_free_mb = torch.cuda.mem_get_info(0)[0] / 1e6
    if installed("ctranslate2"):
        import ctranslate2

        machine.ctranslate2_cuda = int(ctranslate2.get_cuda_device_count())
    return machine
