"""The test suite, one package: ``tests.support`` holds the helpers every module shares."""
