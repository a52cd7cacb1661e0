"""What a run reports: console lines and progress (printer), the header and summary (banner), the metrics file (metrics)."""
