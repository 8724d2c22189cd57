"""A clock for code that takes ``clock`` (and ``sleep``) as arguments: time moves only when told to."""


class FakeClock:
    """``clock()`` is ``now`` (``start`` at first); ``advance(seconds)`` moves it, and so does
    ``sleep(seconds)``: code under test that sleeps moves the clock instead of waiting."""

    def __init__(self, start=0.0):
        self.now = start

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds

    sleep = advance
