"""The scheduler side: the Coordinator plugin (handlers, fan-out, long polls) and the dashboard page.
It carries out what the pure core decides."""
