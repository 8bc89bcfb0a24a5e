"""``spawner.monitor``, the name the images enable the GPU monitor extension by
(``jpserver_extensions``; docs/gpu-monitor.md): the package
``spawner.notebook.monitor`` itself, under its documented name."""

import sys

from spawner.notebook import monitor

sys.modules[__name__] = monitor
