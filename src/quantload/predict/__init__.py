"""Predicting a server's capacity before any load: cost curves measured by llama.cpp's own tools
(`costs`), a model of llama-server's scheduler fed by them and by the workload (`simulator`), and
the SLO limit it predicts with an interval from the curves' error (`limit`).

The one seam between the curves and the simulation is `batch_cost.BatchCost`.
"""
