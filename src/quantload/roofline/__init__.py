"""Roofline: this machine's measured limits, and each file's prefill and decode against them."""
