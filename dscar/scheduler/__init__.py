"""The scheduler side: the Coordinator plugin (handlers, fan-out, long polls), its elastic part (hand-offs,
joiners, switches, standby workers) and the dashboard page. It carries out what the pure core decides."""
