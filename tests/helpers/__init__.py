"""What the tests share, one module a kind: configs, command-line processes, in-process fits, controllers, ...

Test modules import their helpers from here (or a directory's own helper module), never from another test module;
pytest rewrites the asserts of these modules as it does a test's own (tests/conftest.py).
"""
