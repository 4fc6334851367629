"""Driving llama.cpp: finding or building its tools, running them, and reading what they print."""
