"""The run's folder: its lock, catalog, inbox, receipts and summary.json."""
