"""Operating a chain: the management API client, chain diff and probe, other chains,
migrations and teardown."""
