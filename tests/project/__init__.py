"""Checks of the checkout as a whole: the layers, the architecture doc, the README, the docs site,
the wheel, the release, the examples, the deploy files, the container image."""
