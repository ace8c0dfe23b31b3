"""`regen report`'s rendering: the charts (matplotlib) and the page, from the data the engine reads
out of a run folder (engine/run/report_data.py). docs/report.md."""
