"""What the contract workers share: recording the message of an expected error."""


def error_of(call, exc_type):
    """The message of the ``exc_type`` that ``call()`` raises, or None when it raises nothing."""
    try:
        call()
    except exc_type as e:
        return str(e)
    return None
