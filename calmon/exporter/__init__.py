"""Exporters: Prometheus metrics and the HTTP endpoint of the agent."""
