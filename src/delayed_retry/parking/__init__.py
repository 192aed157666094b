"""Parked messages: their records (pure), the parking lot (browse, group, replay, purge)
and the short forms ``peek_parked`` and ``replay_parked``."""
