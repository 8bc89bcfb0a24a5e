"""``python -m spawner.watchdog``: the same as ``quota-spawner watchdog``."""

from spawner.watchdog.app import main

main()
