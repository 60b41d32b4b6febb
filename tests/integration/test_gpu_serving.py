"""On a GPU: the gpu-dlpack profile (latents handed from acoustic to vocoder on the device)
answers every request at concurrency 256 as the gpu profile (latents through the host) does.
The first H100 run of gpu-dlpack refused requests at c=256 with "latent holds NaN or infinite
values" (docs/gpu.md)."""

from __future__ import annotations

import pytest

from bench import gpu_dlpack

pytestmark = pytest.mark.gpu


def test_gpu_dlpack_answers_as_gpu_at_concurrency_256(exported_repository):
    texts = gpu_dlpack.load_texts()
    texts = [texts[k % len(texts)] for k in range(1024)]
    outcomes, (comparison,) = gpu_dlpack.run(["gpu", "gpu-dlpack"], texts, 256, tolerance=0.05)
    assert not outcomes["gpu"].errors and not outcomes["gpu-dlpack"].errors, outcomes
    print(f"\n{comparison}")
    assert not comparison.failed(), comparison
    assert comparison.same_length >= 0.99 * len(texts)
