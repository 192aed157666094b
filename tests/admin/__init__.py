"""Tests of ``delayed_retry.admin``: chain diff and probe, migrations, teardown, the management API
client."""
