"""What Prometheus collected and how it runs: queries, the Prometheus process, stage marks in Grafana."""
