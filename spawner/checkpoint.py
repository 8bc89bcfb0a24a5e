"""``spawner.checkpoint``, the name notebooks import the preemption helpers by
(``on_preempt``, ``notice``, ``seconds_left``; docs/preemption.md): the module
``spawner.notebook.checkpoint`` itself, under its documented name."""

import sys

from spawner.notebook import checkpoint

sys.modules[__name__] = checkpoint
