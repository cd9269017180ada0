"""``skalpel watch``: a flight recorder for a whole training run, which profiles the bad moment by itself.

``recorder.py`` (the hooks, the captures, ``skalpel.watch()``; the step detector times a step's
DataLoader wait, backward and optimizer), ``probe.py`` (what a step cost), ``devicetime.py`` (its device time from
CUDA events, read back late), ``store.py`` (the SQLite file, written off the training thread),
``detect.py`` (anomalies judged online), ``ranks.py`` (a rank that falls behind, under torchrun),
``jobcapture.py`` and ``collect.py`` (a capture of every rank of a torchrun job, one report),
``runner.py`` (``skalpel watch SCRIPT``), ``show.py`` (``--show`` and ``skalpel history``),
``timeline_html.py`` (``--show RUN --html FILE``: the run as a page), ``command.py`` (the CLI's
options). The package is ``watching``: ``skalpel.watch`` is the context manager
(``recorder.watch``), never a module.
"""
