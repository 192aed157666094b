"""What happens to a failing message, decided without a broker: the retry policy and the
tenacity strategies it accepts, immediate retries, the hold until due, the crash guard and the
throttle. Pure. Each idea's broker half has the same name in ``consumer/``
(``recovery/throttle.py`` decides, ``consumer/throttle.py`` acts it out)."""
