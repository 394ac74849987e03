"""The project's demo (``make demo``); not part of the library."""
