"""``python -m spawner.watchdog``: the same as ``quota-spawner watchdog``."""

from .app import main

main()
