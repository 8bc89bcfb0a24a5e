"""The notebook images' Python kernel: ipykernel, then a fast exit.

The images' ``python3`` kernelspec runs ``python -m spawner.notebook.kernel -f
{connection_file}`` instead of ``python -m ipykernel_launcher``: the same kernel, the same
arguments. A kernel asked to shut down (by its notebook, or by its server stopping) then
ends as :mod:`spawner.notebook.launch` ends the server: threads joined, ``atexit``
handlers run (ipykernel closes its sockets and removes its connection file there;
IPython saves its history), without tearing down every module it imported. With PyTorch
imported, that teardown was 0.6 s of a kernel's 1 s of CPU to shut down
(docs/images.md#a-fast-stop).

Signals are untouched: SIGTERM still ends a kernel at once, unless it asked for a
checkpoint (:mod:`spawner.notebook.checkpoint`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from spawner.notebook.launch import run


def main() -> NoReturn:
    # As ipykernel_launcher: the folder `python -m` puts first must not shadow what the
    # kernel imports; IPython adds the working folder back for the user's own code.
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from ipykernel.kernelapp import launch_new_instance

    run(launch_new_instance)


if __name__ == "__main__":
    main()
