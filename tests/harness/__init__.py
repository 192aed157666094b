"""Tests of the repository's broker harness (``harness/``): nodes, clusters, chroots,
containers."""
