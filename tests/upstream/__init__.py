"""The frameworks' own released test suites, run against remit's adapters.

Each suite is the framework's sdist, downloaded at run time (never copied into this
repository); a pytest plugin of ours adds remit's adapter beside the stock persistence
layer in the suite's fixtures, and :mod:`tests.upstream.run` compares the two.
"""
