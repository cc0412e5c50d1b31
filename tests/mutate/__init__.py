"""Mutation testing of the core modules with mutmut: ``make mutate``.

``modules.toml`` names the modules and the test files that cover each;
``equivalent.toml`` lists the mutants no test can kill, with the reason.
docs/reliability.md says how to run it and how to read what it prints.
"""
