"""The expert placement and RPC split tests' shared pieces: device lists as `llama-server
--list-devices` prints them (importable as `placement_fakes`: pytest puts tests/ on sys.path). Used
by tests/unit/test_placement_rpc.py and tests/integration/test_placement_rpc_processes.py."""

from __future__ import annotations

CPU_ONLY_LIST = "Available devices:\n  (none)\n"
RPC_LIST = "Available devices:\n  RPC0[10.213.77.11:50052]: RPC0 (23962 MiB, 20480 MiB free)\n"
