"""Consuming with retries: the decorator, the one at-least-once hand-over, settlement,
waiting until due, and the router of rejected messages."""
