"""``python -m spawner.webapp``: the web app's process (app.py's UsageService)."""

from spawner.webapp.app import main

main()
