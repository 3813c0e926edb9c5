"""convgen's tools: `convgen bench`, `convgen tune`, `convgen sass` and what the commands share.

The library (every ``convgen/*.py`` module) never imports this package: the run-time path
reads tuned plans from :mod:`convgen.tuning_db` and settings from :mod:`convgen.config`,
so ``import convgen`` loads neither the tuner nor the bench (tests/test_layering.py checks
it).  The ``convgen`` command itself (:mod:`convgen.cli`) is a tool too; it stays at its
path because ``python -m convgen.cli`` and the console script name it.
"""
