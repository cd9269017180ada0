"""``skalpel watch``: a flight recorder for a whole training run, which profiles the bad moment by itself.

``recorder.py`` (the hooks, the captures), ``probe.py`` (what a step cost), ``store.py`` (the
SQLite file, written off the training thread), ``detect.py`` (anomalies judged online),
``runner.py`` (``skalpel watch SCRIPT``), ``show.py`` (``--show`` and ``skalpel history``),
``command.py`` (the CLI's options).
"""
