"""One run as two objects: its plan, settled before any engine, and its context."""
