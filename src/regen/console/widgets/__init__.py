"""The console's panes."""
