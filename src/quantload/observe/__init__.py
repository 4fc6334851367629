"""What Prometheus collected: queries, dashboard checks, and stage marks in Grafana."""
