"""Moving parked messages (replay, purge, refresh): the engine (:mod:`.engine`), what it does
to each message (:mod:`.actions`), what it counts and reports (:mod:`.report`, pure) and the
canary: its rules (:mod:`.canary_rules`, pure) and its watch (:mod:`.canary`)."""
