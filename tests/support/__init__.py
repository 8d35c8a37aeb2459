"""The tests' shared helpers: modules used by the tests of more than one folder, by bench/ or by the Makefile.

Imported as `support.<module>`: pytest puts tests/ on the import path (`pythonpath` in pyproject.toml); a script
run outside pytest is started with `PYTHONPATH=tests` (the Makefile does), and a test's child process gets the
same through its environment. A helper used by the tests of one folder only stays in that folder.
"""
