"""A differential fuzzer of the communicators: random programs on every backend, checked against NumPy.

``python -m tests.fuzz --seconds S --seed K``; modules: :mod:`~tests.fuzz.program` (the generator),
:mod:`~tests.fuzz.oracle` (inputs and NumPy's answers), :mod:`~tests.fuzz.executor` (one rank),
:mod:`~tests.fuzz.jobs` (starting and watching jobs), :mod:`~tests.fuzz.judge` (verdicts),
:mod:`~tests.fuzz.known` (open bugs and documented limits), :mod:`~tests.fuzz.driver` (the command).
"""
