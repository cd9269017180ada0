"""``skalpel tune``: rerun a script with each applicable fix, measure the gain, recommend only what helped.

candidates (what can be tried, and the edit each stands for) -> launch + patches (one run with one
fix, in the script's process: the only modules here that import torch) -> measure (that run as a
subprocess) -> stats (step time, noise, verdict) -> session (order, budget, recommendation) ->
render / html / result (terminal, page, ``skalpel.tune/1`` JSON).
"""
