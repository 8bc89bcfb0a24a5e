"""Print what deep-learning framework an image's Python holds, in one line.

scripts/build-images.sh runs this in each notebook image's base (the local
framework base or the upstream CUDA image) and stores the line as the image
label quota-spawner.frameworks, which the spawn form shows next to the
image's name: "PyTorch 2.14.1 · CUDA 13.0" or "PaddlePaddle 3.0.0 · CPU build".
"""

import importlib.metadata as md
import importlib.util


def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def torch_line():
    v = version("torch")
    if not v or importlib.util.find_spec("torch") is None:
        return None
    import torch.version as tv  # imports torch; fine at build time

    cuda = getattr(tv, "cuda", None)
    return f"PyTorch {v.split('+')[0]} · " + (f"CUDA {cuda}" if cuda else "CPU build")


def paddle_line():
    v = version("paddlepaddle-gpu", "paddlepaddle")
    if not v or importlib.util.find_spec("paddle") is None:
        return None
    import paddle

    cuda = paddle.version.cuda() if paddle.is_compiled_with_cuda() else None
    return f"PaddlePaddle {v} · " + (f"CUDA {cuda}" if cuda and cuda != "False" else "CPU build")


print(" + ".join(line for line in (torch_line(), paddle_line()) if line) or "no framework")
