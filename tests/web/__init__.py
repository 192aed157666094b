"""Tests of ``delayed_retry.web``: the web view's logic, API, ASGI form, browser."""
