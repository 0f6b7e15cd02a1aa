"""The test suite (a package, so test modules share `tests.helpers` by relative import)."""
